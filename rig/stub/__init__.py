"""A paced OpenAI-compatible streaming stub server: the ground truth for the load engine's clock
and the faults a real vLLM cannot be made to show."""
