"""Pull the candidate CUDA file out of a policy completion.

The prompt asks for one ```cuda block holding the complete file. A completion may carry several blocks (drafts,
then the final one), blocks in other languages, or end inside a block because generation hit its token limit.
The rule: the LAST block labelled cuda/cu/c++/cpp wins; when no block carries one of those labels, the last
unlabelled block; an unterminated final block counts (up to the end of the text). Reasoning models' text up to
the last `</think>` is ignored when an answer follows it. The chosen source must mention `cudal2_hgemm`.

Nothing here raises: every outcome is an `Extraction` with a status and a one-line reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

ENTRY_POINT = "cudal2_hgemm"
CUDA_LANGS = frozenset({"cuda", "cu", "c++", "cpp"})

# An opening fence: up to 3 spaces of indentation, three or more backticks, an optional info string.
_OPEN_RE = re.compile(r"^ {0,3}(`{3,})\s*([^`\s]*)[^`]*$")
_ENTRY_RE = re.compile(r"\b" + ENTRY_POINT + r"\b")
_THINK_END = "</think>"


class ExtractStatus(str, Enum):
    OK = "ok"
    NO_CODE_BLOCK = "no_code_block"  # no fenced block (in cuda/cu/c++/cpp or unlabelled) in the completion
    NO_ENTRY_POINT = "no_entry_point"  # the chosen block never mentions cudal2_hgemm
    EMPTY = "empty"  # empty completion, or the chosen block is empty


@dataclass(frozen=True)
class Extraction:
    status: ExtractStatus
    source: str | None  # the stripped block text when status is OK, else None
    reason: str  # one line; for OK, notes such as an unterminated fence

    @property
    def ok(self) -> bool:
        return self.status is ExtractStatus.OK


@dataclass(frozen=True)
class _Block:
    lang: str  # lower-cased first word of the info string ("" when unlabelled)
    body: str
    closed: bool


def _blocks(text: str) -> list[_Block]:
    """Fenced blocks in order. A closing fence is a line of at least as many backticks as the opening one."""
    blocks: list[_Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _OPEN_RE.match(lines[i])
        if not m:
            i += 1
            continue
        ticks, lang = m.group(1), m.group(2).lower()
        body: list[str] = []
        i += 1
        closed = False
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped.startswith(ticks) and set(stripped) == {"`"}:
                closed = True
                i += 1
                break
            body.append(lines[i])
            i += 1
        blocks.append(_Block(lang, "\n".join(body), closed))
    return blocks


def extract_source(completion: str) -> Extraction:
    """The candidate file in `completion` (see the module docstring for the rule). Never raises."""
    try:
        return _extract(completion)
    except Exception as e:  # defensive: a reward must never crash on odd text
        return Extraction(ExtractStatus.EMPTY, None, f"extraction failed: {type(e).__name__}: {e}".splitlines()[0])


def _extract(completion: str) -> Extraction:
    if not isinstance(completion, str):
        return Extraction(ExtractStatus.EMPTY, None, f"completion is {type(completion).__name__}, not text")
    text = completion
    if _THINK_END in text:
        answer = text.rsplit(_THINK_END, 1)[1]
        if answer.strip():
            text = answer
    if not text.strip():
        return Extraction(ExtractStatus.EMPTY, None, "empty completion")

    blocks = _blocks(text)
    labelled = [b for b in blocks if b.lang in CUDA_LANGS]
    unlabelled = [b for b in blocks if not b.lang]
    chosen = labelled[-1] if labelled else unlabelled[-1] if unlabelled else None
    if chosen is None:
        if blocks:
            langs = ", ".join(sorted({b.lang for b in blocks}))
            return Extraction(ExtractStatus.NO_CODE_BLOCK, None, f"no cuda code block (only: {langs})")
        return Extraction(ExtractStatus.NO_CODE_BLOCK, None, "no fenced code block")

    source = chosen.body.strip()
    label = f"```{chosen.lang}" if chosen.lang else "unlabelled ```"
    if not source:
        return Extraction(ExtractStatus.EMPTY, None, f"the last {label} block is empty")
    if not _ENTRY_RE.search(source):
        return Extraction(ExtractStatus.NO_ENTRY_POINT, None, f"the last {label} block does not define {ENTRY_POINT}")
    notes = [f"last {label} block of {len(blocks)}"]
    if not chosen.closed:
        notes.append("unterminated fence (completion truncated?)")
    return Extraction(ExtractStatus.OK, source, "; ".join(notes))


def extract_for_reward(text: object) -> tuple[str | None, str]:
    """(source, reason) for the reward adapter: source is None unless extraction succeeded. Never raises.

    Accepts a plain completion string or TRL's conversational form (a list of {"role", "content"} messages, or one
    such message), taking the last assistant message's content.
    """
    try:
        if isinstance(text, dict):
            text = text.get("content", "")
        elif isinstance(text, (list, tuple)):
            contents = [
                m.get("content", "") for m in text if isinstance(m, dict) and m.get("role", "assistant") == "assistant"
            ]
            text = contents[-1] if contents else ""
        ex = extract_source(text)  # type: ignore[arg-type]
        return (ex.source if ex.ok else None), (ex.reason if ex.ok else f"{ex.status.value}: {ex.reason}")
    except Exception as e:
        return None, f"extraction failed: {type(e).__name__}"
