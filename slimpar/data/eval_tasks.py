"""Local lm-evaluation-harness tasks built from held-out real text (no hub downloads).

Three tasks ship with slimpar; their definitions are here, their documents are built on the user's
machine from the installed corpora and written as JSON lines next to lm-eval task files:

- ``slimpar_shakespeare_bpb``: bits per byte (rolling log-likelihood) on the Shakespeare works a run
  held out (the same works as ``data.heldout_works`` chooses for the run's own validation);
- ``slimpar_wikipedia_bpb``: the same on gensim's Wikipedia articles (out of domain);
- ``slimpar_shakespeare_nextline``: multiple choice, the true next line of a held-out passage
  against three lines drawn from elsewhere in the held-out works (chance: 25%).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from slimpar.data.corpora import shakespeare_works, split_works, wikipedia_articles
from slimpar.data.text import HELDOUT_SEED  # the held-out works of every run

CHUNK_LINES = 60  # lines of verse per bits-per-byte document
WIKI_CHUNK_CHARS = 3000  # characters (whole paragraphs) per Wikipedia document
CONTEXT_LINES = 4  # lines shown before the line to choose
CHOICES = 4
NEXTLINE_ITEMS = 500
MIN_LINE_CHARS = 20  # stage directions and speaker names are too short to be a fair choice

_ROLLING = {"output_type": "loglikelihood_rolling", "test_split": "test", "doc_to_text": "",
            "doc_to_target": "{{text}}",
            "metric_list": [{"metric": m, "aggregation": agg, "higher_is_better": False} for m, agg in (
                ("bits_per_byte", "bits_per_byte"), ("byte_perplexity", "weighted_perplexity"),
                ("word_perplexity", "weighted_perplexity"))]}
TASKS: dict[str, dict] = {
    "slimpar_shakespeare_bpb": _ROLLING,
    "slimpar_wikipedia_bpb": _ROLLING,
    "slimpar_shakespeare_nextline": {
        "output_type": "multiple_choice", "test_split": "test", "doc_to_text": "context",
        "doc_to_choice": "choices", "doc_to_target": "label", "target_delimiter": "\n",
        "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in ("acc", "acc_norm")]},
}


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def shakespeare_documents(heldout_works: int) -> list[dict]:
    _, held = split_works(shakespeare_works(), heldout_works, HELDOUT_SEED)
    docs = []
    for text in held:  # the text as the run's own validation reads it: indentation and blank lines kept
        lines = text.splitlines(keepends=True)
        docs += [{"text": "".join(lines[i:i + CHUNK_LINES])} for i in range(0, len(lines), CHUNK_LINES)]
    return [d for d in docs if d["text"].strip()]


def wikipedia_documents(cache_dir: str | None = None) -> list[dict]:
    docs, current = [], ""
    for para in (p.strip() for p in wikipedia_articles(cache_dir).split("\n\n")):
        if not para:
            continue
        current = f"{current}\n\n{para}" if current else para
        if len(current) >= WIKI_CHUNK_CHARS:
            docs.append({"text": current})
            current = ""
    return docs + ([{"text": current}] if current else [])


def nextline_items(heldout_works: int, n: int = NEXTLINE_ITEMS, seed: int = 0) -> list[dict]:
    """Contexts of ``CONTEXT_LINES`` lines, the true next line and 3 lines from at least 200 lines away."""
    _, held = split_works(shakespeare_works(), heldout_works, HELDOUT_SEED)
    lines = [ln for text in held for ln in _lines(text)]
    long = np.array([len(ln) >= MIN_LINE_CHARS for ln in lines])
    rng = np.random.default_rng(seed)
    candidates = [i for i in range(CONTEXT_LINES, len(lines)) if long[i]]
    pool = np.flatnonzero(long)
    items = []
    for i in rng.choice(candidates, size=min(n, len(candidates)), replace=False):
        far = pool[np.abs(pool - i) > 200]
        wrong = [lines[j] for j in rng.choice(far, size=CHOICES - 1, replace=False)]
        label = int(rng.integers(CHOICES))
        choices = wrong[:label] + [lines[i]] + wrong[label:]
        items.append({"context": "\n".join(lines[i - CONTEXT_LINES:i]), "choices": choices, "label": label})
    return items


def write_tasks(folder: Path, heldout_works: int, cache_dir: str | None = None) -> list[str]:
    """Write every task's documents (``NAME.jsonl``) and lm-eval file (``NAME.yaml``) into ``folder``.

    The YAML files are JSON (a subset of YAML) naming their data file by absolute path, since lm-eval
    resolves ``data_files`` against the working directory.
    """
    folder.mkdir(parents=True, exist_ok=True)
    builders = {"slimpar_shakespeare_bpb": lambda: shakespeare_documents(heldout_works),
                "slimpar_wikipedia_bpb": lambda: wikipedia_documents(cache_dir),
                "slimpar_shakespeare_nextline": lambda: nextline_items(heldout_works)}
    for name, build in builders.items():
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in build()))
        spec = {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data.resolve())}},
                **TASKS[name]}
        (folder / f"{name}.yaml").write_text(json.dumps(spec, indent=2) + "\n")
    return list(builders)
