"""fim.make_prompt over a spread of places, budgets and layouts, against the
prompts recorded before it was rewritten as small steps (2026-12-05, on
92a3951): every field of every prompt, token for token (the ids and texts as
digests). The tokenizers are the byte-level ones of tests/test_fim.py (one
token per byte, built in code), so the record does not move with a
tokenizers release.

    python -m tests.test_prompt_golden    # re-record (only when a change of the prompts is meant)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerFast

from soldaemon import fim
from tests.test_fim import (DEEPSEEK_SPECIALS, QWEN_SPECIALS, STARCODER2_SPECIALS, byte_tokenizer,
                            llama_tokenizer)

RECORD = Path(__file__).parent / "data" / "prompts_golden.json"

SOURCE = '''\
"""A small module to cut holes in: classes, methods, a long function."""

import os
from dataclasses import dataclass, field


@dataclass
class Store:
    """Counts lookups."""

    items: dict[str, int] = field(default_factory=dict)
    lookups: int = 0

    def get(self, key: str) -> int | None:
        self.lookups += 1
        if key in self.items:
            return self.items[key]
        return None

    def put(self, key: str, value: int) -> None:
        self.items[key] = value


def total(paths: list[str]) -> int:
    result = 0
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    result += len(line)
    return result


def main() -> None:
    store = Store()
    store.put("a", 1)
    print(store.get("a"), total(["x.txt", "y.txt"]))


if __name__ == "__main__":
    main()
'''
OTHER = ("util.py", "def helper(x):\n    return x * 2\n\n\nclass Box:\n    def __init__(self, v):\n"
                    "        self.v = v\n")


def tokenizers() -> dict[str, PreTrainedTokenizerFast]:
    return {
        "qwen": byte_tokenizer(QWEN_SPECIALS, eos="<|im_end|>", name="tiny-qwen"),
        "starcoder": byte_tokenizer(STARCODER2_SPECIALS, bos="<|endoftext|>", eos="<|endoftext|>"),
        "deepseek": byte_tokenizer(DEEPSEEK_SPECIALS, bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>"),
        "codellama": llama_tokenizer(),
    }


def cases() -> list[dict[str, Any]]:
    """Places across the file (mid-word, line ends, blank lines, indentation)
    crossed with budgets and layouts; each a dict of make_prompt's inputs."""
    cuts = sorted({(i * 97) % len(SOURCE) for i in range(1, 13)}
                  | {SOURCE.index("        if key in"), SOURCE.index("        return None") + 8,
                     SOURCE.index("    result = 0\n") + 4, SOURCE.index("                    result +=") + 25,
                     SOURCE.index("def main") - 1, len(SOURCE) - 1})
    layouts: list[dict[str, Any]] = [
        {"prefix_tokens": 4000, "suffix_tokens": 4000},
        {"prefix_tokens": 120, "suffix_tokens": 40, "grain_lines": 2},
        {"prefix_tokens": 200, "suffix_tokens": 60, "outline_tokens": 80, "context_tokens": 160},
        {"prefix_tokens": 160, "suffix_tokens": 80, "context": [OTHER, ("b.py", "B = 2\n")], "context_tokens": 90,
         "language": "python", "current_path": "mod.py"},
        {"prefix_tokens": 300, "suffix_tokens": 50, "context": [OTHER], "current_path": "m.py",
         "order": "spm"},
        {"prefix_tokens": 150, "suffix_tokens": 50, "heal": True},
        {"prefix_tokens": 150, "suffix_tokens": 50, "heal": True, "lead": "line", "outline_tokens": 60},
        {"prefix_tokens": 48, "suffix_tokens": 20, "heal": True, "lead": "back"},
        {"prefix_tokens": 200, "suffix_tokens": 40, "lead": "line", "order": "spm", "heal": True},
        {"prefix_tokens": 10, "suffix_tokens": 10, "lead": "line"},
    ]
    out = []
    for cut in cuts:
        for k, layout in enumerate(layouts):
            prefix = SOURCE[:cut]
            lead = layout.get("lead")
            lead_from = (None if lead is None else fim.line_anchor(prefix) if lead == "line"
                         else max(0, prefix.rfind("\n", 0, max(0, len(prefix) - 1)) + 1))
            out.append({**{n: v for n, v in layout.items() if n != "lead"}, "name": f"{cut}/{k}", "prefix": prefix,
                        "suffix": SOURCE[cut:], "lead_from": lead_from})
    return out


def make(template: fim.FimTemplate, tok: Any, case: dict[str, Any]) -> fim.FimPrompt:
    place = fim.Place(case["prefix"], case["suffix"], context=case.get("context", ()), language=case.get("language"),
                      current_path=case.get("current_path"),
                      lead_from=case["lead_from"])
    budget = fim.Budget(case["prefix_tokens"], case["suffix_tokens"], context=case.get("context_tokens", 1024),
                        outline=case.get("outline_tokens", 0), grain_lines=case.get("grain_lines", 16))
    return fim.make_prompt(template, tok, place, budget, order=case.get("order", "psm"), heal=case.get("heal", False))


def digest(prompt: fim.FimPrompt) -> str:
    """Every field: the ids and the texts as digests, the counts and the
    healed text as they are."""
    def h(x: object) -> str:
        return hashlib.sha256(json.dumps(x).encode()).hexdigest()[:16]

    return (f"ids {h(prompt.ids)} n {len(prompt.ids)} prefix {h(prompt.prefix_text)} suffix {h(prompt.suffix_text)} "
            f"counts {prompt.n_prefix_tokens} {prompt.n_suffix_tokens} {prompt.n_context_tokens} {prompt.n_middle} "
            f"heal {json.dumps(prompt.heal)}")


def prompts() -> dict[str, str]:
    found: dict[str, str] = {}
    for name, tok in tokenizers().items():
        template = fim.detect_template(tok)
        for case in cases():
            found[f"{name} {case['name']}"] = digest(make(template, tok, case))
    return found


def test_the_prompts_are_the_recorded_ones_token_for_token() -> None:
    recorded = json.loads(RECORD.read_text())
    now = prompts()
    assert len(now) == len(recorded) >= 400
    differ = [name for name in recorded if now.get(name) != recorded[name]]
    assert not differ, f"{len(differ)} of {len(recorded)} prompts differ, e.g. {differ[:5]}: " + json.dumps(
        {n: {"recorded": recorded[n], "now": now.get(n)} for n in differ[:2]}, indent=1)


if __name__ == "__main__":
    RECORD.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in prompts().items())
                      + "\n}\n")
    print(f"recorded {RECORD}")
