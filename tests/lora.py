"""A small LoRA adapter made at test time with PEFT, on the test's chat model.

Its weights are random and large (not trained): enough to change what greedy
decoding picks, so a test can tell the adapter's answers from the base model's."""

from __future__ import annotations

from pathlib import Path

# q_proj and v_proj: the layers PEFT's own examples adapt; every Llama-style model
# (SmolLM2 too) has them, and vLLM's LoRA layers cover them.
TARGET_MODULES = ("q_proj", "v_proj")
RANK = 8
# PEFT's non-default init (init_lora_weights=False) draws B at random too, but small:
# measured with SmolLM2-135M, B x 50 turns the greedy answers into other text.
B_SCALE = 50.0


def make_lora_adapter(base_model: Path, target: Path, *, seed: int = 0) -> Path:
    """Write a PEFT LoRA adapter for the model folder `base_model` into `target`
    (adapter_config.json and adapter_model.safetensors) and return `target`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    config = LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=list(TARGET_MODULES),
                        init_lora_weights=False, task_type="CAUSAL_LM")
    adapted = get_peft_model(model, config)
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.mul_(B_SCALE)
    adapted.save_pretrained(target)
    return target
