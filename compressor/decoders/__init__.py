"""Decoder language models: text data, shapes, memory footprint and the LLM catalogue."""
