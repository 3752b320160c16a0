"""Training and evaluation data, all offline: text corpora and token batches (``corpora``, ``text``), tokenizers
and a config's vocabulary size (``tokenizer``, ``vocab``), images (``images``), each worker's share of a batch
(``shares``), start-up checks that the data is installed (``sources``), local evaluation tasks (``eval_tasks``),
checked cache files (``cache``) and the data layer's errors (``errors``)."""

__all__ = ["cache", "corpora", "errors", "eval_tasks", "images", "shares", "sources", "text", "tokenizer", "vocab"]
