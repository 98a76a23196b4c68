"""Where a hybrid's checkpoints land, for what `galahad warm` sends and `ready` reports.

SGLang 0.5.23 keeps a recurrent-state checkpoint only on its grid C = max(FLA chunk 64, page
size) and a prefill's state only at the request's last grid position, C*floor(N/C); a request
of N tokens resumes at most at B = C*floor((N-1)/C) (the strict prefix, docs/CHECKPOINTS.md).
This module is that arithmetic and nothing else, pure (no I/O, no torch or SGLang);
tests/test_checkpoint_prefill.py holds it to the tests' oracle (tests/support/checkpoints.py).

A document of D tokens is sent as: its prefix of C*floor((D-1)/C) tokens first when that is a
different grid position (D a multiple of C), then the whole document (its first part found in
the device cache, only the rest computed). Later prompts that continue the document find the
state at C*floor(D/C), and the document resent alone finds the one at C*floor((D-1)/C).
`checkpoint_every` adds grid positions inside the document (for prompts that leave it early).
"""

from __future__ import annotations

from collections.abc import Iterable

MAMBA_CHUNK_TOKENS = 64  # SGLang's FLA chunk: the checkpoint grid is max(64, page_size)


def checkpoint_interval(page_size: int) -> int:
    """SGLang's hybrid checkpoint grid C = max(FLA chunk 64, page size)."""
    return max(MAMBA_CHUNK_TOKENS, page_size)


def strict_prefix_bound(num_tokens: int, interval: int) -> int:
    """B = C*floor((N-1)/C): the deepest checkpoint a request of N tokens can restore."""
    return interval * max(0, (num_tokens - 1) // interval)


def grid_floor(num_tokens: int, interval: int) -> int:
    """C*floor(N/C): the last grid position of N tokens (where a prefill leaves its state, and
    how far a hybrid's radix cache holds, and backs up, whole grid units)."""
    return interval * (num_tokens // interval)


def prefill_plan(num_tokens: int, interval: int, checkpoint_every: int = 0) -> list[int]:
    """The prefix lengths to send, in order, so that a hybrid's prefill leaves a checkpoint at
    every grid position later prompts need (see the module docstring); the last is N."""
    points = set()
    if checkpoint_every:
        if checkpoint_every % interval:
            raise ValueError(
                f"checkpoint_every={checkpoint_every}: expected a multiple of the checkpoint "
                f"grid C={interval}"
            )
        points.update(range(checkpoint_every, num_tokens, checkpoint_every))
    alone = strict_prefix_bound(num_tokens, interval)
    if 0 < alone < grid_floor(num_tokens, interval):
        points.add(alone)
    return sorted(point for point in points if point < num_tokens) + [num_tokens]


def state_pages(plan: list[int], interval: int, page_size: int) -> list[int]:
    """Page indices whose state a prefill plan leaves (one per request, at its last grid
    position; none for a request shorter than C)."""
    pages = {grid_floor(length, interval) // page_size - 1 for length in plan}
    return sorted(page for page in pages if page >= 0)


def deepest_checkpoint(checkpoints: Iterable[int], limit_tokens: int) -> int:
    """The deepest checkpoint position at most `limit_tokens` (0: none): where a hybrid's
    restore resumes when the KV of `limit_tokens` tokens is there."""
    return max((point for point in checkpoints if point <= limit_tokens), default=0)
