"""A Hugging Face model folder (config.json, safetensors, tokenizer.json) made into a GGUF
file that llama.cpp runs (convert.py), quantized by llama.cpp itself (quantize.py)."""
