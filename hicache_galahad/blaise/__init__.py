"""Blaise, the text memory: documents kept byte-exact in verified sections; a question
selects, on the CPU, the one section it needs, and the model reads only that.

Pure code apart from the record store; no torch or SGLang. See docs/BLAISE.md.
"""

from .memory import Blaise, Selection, Selections, Skipped
from .prompt import Prompt, compose
from .rank import RankParams
from .segment import Section, estimate_tokens, segment

__all__ = [
    "Blaise",
    "Prompt",
    "RankParams",
    "Section",
    "Selection",
    "Selections",
    "Skipped",
    "compose",
    "estimate_tokens",
    "segment",
]
