"""Single-device models (no distributed code here): parallelism is applied from outside."""

from slimpar.models.llama import Llama, LlamaConfig
from slimpar.models.resnet import ResNet, ResNetConfig, resnet18, wrn18
from slimpar.models.swin import Swin, SwinConfig

__all__ = ["Llama", "LlamaConfig", "ResNet", "ResNetConfig", "resnet18", "wrn18", "Swin", "SwinConfig"]
