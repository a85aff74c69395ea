"""The embedded models the rig builds itself (tiny, tiny-lm, tiny-gdn, tiny-qwen35): their
architecture, weights and tokenizer, generated locally and cached."""
