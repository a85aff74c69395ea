"""What to run: the scenario file, its presets, the prompts and the ordered requests of each
level. Reads files; starts nothing."""
