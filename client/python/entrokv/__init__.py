"""Python client of entrokvd, the Page-EntroKV cache manager."""

from entrokv.client import Client, EntrokvError, GroupDecision, LayerDecision

__all__ = ["Client", "EntrokvError", "GroupDecision", "LayerDecision"]
