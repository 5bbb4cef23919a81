# -*- coding: utf-8 -*-
"""What the smoke reads of a chat answer: its text (the content, else the reasoning) and whether that text has the
shape of a broken kernel rather than of language.  Pure functions, standard library only (the smoke module runs
on the host).

Why a served answer is judged at all: Kimi-K2.5's INT4 experts on a Marlin MoE path that is wrong for the GPU
answered "foss foss foss ..." with ``/health`` 200 and ``/v1/models`` fine (vllm#40357, sglang#23264).  A greedy
answer of ``smoke_max_tokens`` to a question has none of these shapes:

=====================  ==================================================================================
shape                  rule
=====================  ==================================================================================
empty                  no text once ``<think>...</think>`` and blanks are stripped (and no reasoning field)
replacement chars      a quarter or more of its characters are U+FFFD (bytes that decode to nothing)
one character          8+ characters that are one or two characters repeated ("!!!!!!!!", "哈哈哈哈...")
a word loop            4+ words that are one, two or three words repeated ("foss foss foss foss")
one dominant word      8+ words of which three quarters or more are the same word
=====================  ==================================================================================

Words compare without case and the punctuation around them ("Foss, foss. FOSS" is one word three times).
"""
from __future__ import annotations

import re
from collections import Counter

THINK = re.compile(r"<think>.*?(</think>|\Z)", re.S)
WORD_EDGE = re.compile(r"^\W+|\W+$")


def answer_text(message):
    """(text, from_reasoning) of a chat completion's ``choices[0].message``: its content without ``<think>``
    blocks, else its reasoning (vLLM's ``reasoning``, SGLang's ``reasoning_content``: with a reasoning parser a
    short answer can land there entirely, content empty or null - a good load)."""
    message = message if isinstance(message, dict) else {}
    content = message.get("content")
    text = THINK.sub("", content).strip() if isinstance(content, str) else ""
    if text:
        return text, False
    for key in ("reasoning", "reasoning_content"):
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip(), True
    return "", False


def _loop(seq, longest, repeats):
    """The shortest period (<= ``longest``) that ``seq`` repeats at least ``repeats`` times, else 0."""
    for period in range(1, longest + 1):
        if len(seq) >= period * repeats and all(seq[i] == seq[i - period] for i in range(period, len(seq))):
            return period
    return 0


def degenerate(text):
    """Why ``text`` is not language (one sentence, the evidence quoted), or "" when it may be."""
    if not text.strip():
        return "the answer is empty (no text in content or reasoning)"
    chars = [c for c in text if not c.isspace()]
    bad = chars.count("\ufffd")
    if bad * 4 >= len(chars):
        return "%d of its %d characters are U+FFFD (bytes that decode to no character)" % (bad, len(chars))
    period = _loop(chars, 2, 4) if len(chars) >= 8 else 0
    if period:
        return "it is %r repeated (%d characters)" % ("".join(chars[:period]), len(chars))
    words = [w for w in (WORD_EDGE.sub("", w).lower() for w in text.split()) if w]
    period = _loop(words, 3, 4 if len(words) >= 4 else len(words) + 1)
    if period:
        return "it is %r repeated (%d words)" % (" ".join(words[:period]), len(words))
    if len(words) >= 8:
        word, n = Counter(words).most_common(1)[0]
        if n * 4 >= len(words) * 3:
            return "%r is %d of its %d words" % (word, n, len(words))
    return ""
