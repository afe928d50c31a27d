"""The repository speaks of the product, not of when or in which work item something was done: no "session 12",
"issue 3", "round 2", ``s39``-style tags or ``ISSUE5`` knobs in any tracked file's name or text (``.gz`` files are
read decompressed). Findings are cited by topic (``docs/findings.md``), results by what they measure.

Ordinary words pass: "issues" about bugs, "rounding", an HTTP or LLM client's "session", a CLI's ``--rounds 3``, and
kernel-config tokens whose ``s<n>`` is a split or a swizzle (``64x64_s16_st8``, ``c1x1_s16_rn``, the knob ``s32``).
"""

from __future__ import annotations

import gzip
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# a work-item word followed by its number: "session 12", "sessions 1-34", "issue-3", "issue3_", "ISSUE5", "round 2"
_NUMBERED = r"(?<![a-z])(?:sessions?|issues?|rounds?)[ _-]?\#?\d+(?!\d|\.\d)"
# a two-digit s-tag standing alone in a name or in prose: "_s39_", "-s28-", "(s33)"; not inside a word or a number
_S_TAG = r"(?<![A-Za-z0-9.])[sS][1-9]\d(?![0-9A-Za-z])"
PATTERN = re.compile(f"(?i:{_NUMBERED})|{_S_TAG}")

# s<n> that is a kernel-config field, not a tag: split S of a tile (``64x64_s16_st8``, ``64x128_s16)``,
# ``cluster_splitk_S16``), a CUTLASS swizzle knob (``c1x1_s16_rn``, ``:s16_rn``, `` `s32` ``, ``s16``/``s32`` as a
# knob list) — recognised by what stands next to it
_CONFIG_BEFORE = re.compile(r"(?:\d+x\d+(?:x\d+)?_|c\dx\d_|splitk_|:|[0-9a-f]{8}-)$")  # last: a temp dir's suffix
_CONFIG_AFTER = re.compile(r"^(?:_st\d|_rn|_rs|_g\d|_kw\d|_es|_fp16|_bf16)")
_KNOB = re.compile(r"`s(?:16|32)`")
# "--rounds 3" is the tuner's option (rounds of search), not a work item
_OPTION_BEFORE = re.compile(r"--$")

BINARY = (".png", ".jpg", ".pdf", ".tgz", ".whl")
# this file names the words it looks for
EXCEPTIONS = {"tests/test_no_history_words.py"}


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:  # an sdist or a copy without .git
        pytest.skip(f"not a git checkout: {e}")
    return [p for p in out.decode().split("\0") if p]


_BASE64 = re.compile(r"base64,[A-Za-z0-9+/=]+")  # an embedded image in an HTML report


def history_words(text: str) -> list[str]:
    """Each history word in ``text`` with a little context, in order."""
    text = _BASE64.sub("base64,", text)
    found = []
    for m in PATTERN.finditer(text):
        before, after = text[max(0, m.start() - 12):m.start()], text[m.end():m.end() + 6]
        word = m.group(0)
        if word[0] in "sS" and word[1].isdigit() and (_CONFIG_BEFORE.search(before) or _CONFIG_AFTER.match(after)
                                                      or _KNOB.match(text, m.start() - 1)):
            continue
        if word.lower().startswith("round") and _OPTION_BEFORE.search(before):
            continue
        found.append(f"...{before}{word}{after}...".replace("\n", " "))
    return found


def _text(path: Path) -> str:
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


@pytest.mark.parametrize("text, words", [
    ("measured in session 12 on the H100", 1), ("issue 3's 120 shapes", 1), ("ISSUE5=1 gpu_run.sh", 1),
    ("h100_grid1000_measure1000_s39.png", 1), ("costmodel-s28-final", 1), ("round 2 of the screen", 1),
    ("scripts/issue3_table.py", 1), ("h100_issue3_120_done", 1), ("around 2 us", 0), ("the warps issue 0.50 instructions a cycle", 0), ("sessions 33-34", 1), ("(s33)", 1), ("issues3-5", 1),
    ("known issues with the driver", 0), ("rounding to fp16", 0), ("an HTTP session reused", 0),
    ("gemmrl tune --rounds 3", 0), ("tiny:64x64_s16_st8_fp16", 0), ("pingpong_64x256x64_c1x1_s16_rn", 0),
    ("knobs `s16`, `s32`", 0), ("grid100s1 held50s2", 0), ("cluster_splitk_S16", 0), ("cublas-828a532a7c1c3e4e-s39_tlzz", 0), ("data:image/png;base64,xFS30/0v", 0), ("s1 split", 0),
])
def test_patterns(text, words):
    assert len(history_words(text)) == words, history_words(text)


def test_no_history_words_in_names():
    bad = [p for p in _tracked() if history_words(p)]
    assert not bad, f"{len(bad)} tracked file names carry history words (rename by what they hold): {bad[:20]}"


def test_no_history_words_in_text():
    bad = {}
    for p in _tracked():
        if p.endswith(BINARY) or p in EXCEPTIONS or not (ROOT / p).is_file():
            continue
        words = history_words(_text(ROOT / p))
        if words:
            bad[p] = words
    lines = [f"{p}: {len(w)}, e.g. {w[0]}" for p, w in sorted(bad.items())]
    assert not bad, (f"{sum(map(len, bad.values()))} history words in {len(bad)} files (cite findings by topic, "
                     "results by what they measure):\n" + "\n".join(lines[:60]))
