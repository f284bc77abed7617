"""Batches from a Python iterable, in the forms a PyTorch user has them, turned into the
runtime's table-major CSR layout (data/batch.h) on the oracle's thread."""

import numpy as np


def _array(values, dtype, what):
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{what}: expected numbers, got an array of {array.dtype}")
    if np.dtype(dtype).kind == "i" and array.dtype.kind not in "iu" and array.size > 0:
        # Casting would truncate 1.7 to row 1 (nn.EmbeddingBag refuses float indices too).
        raise ValueError(f"{what}: expected integers, got an array of {array.dtype}")
    if np.dtype(dtype) == np.int64 and array.dtype.kind == "u" and array.size > 0:
        # uint64 beyond int64 would wrap around to a negative number.
        too_large = array.reshape(-1) > np.iinfo(np.int64).max
        if too_large.any():
            index = int(np.argmax(too_large))
            raise ValueError(f"{what}: {array.reshape(-1)[index]} (position {index}) is larger "
                             f"than any index (int64)")
    return np.ascontiguousarray(array, dtype=dtype)


class Normalizer:
    """Turns one item of the iterable into (dense float32 [n, num_dense], labels float32 [n],
    offsets int64 [num_tables * n + 1], ids int64), raising ValueError on a malformed item.

    An item is a dict: ``labels`` [n] (or [n, 1]); ``dense`` [n, num_dense] (may be left out
    when there are no dense features); ``ids``: a list with one 1-D array of row ids per table;
    optional ``offsets``: a list with, per table, n bag starts (as nn.EmbeddingBag takes them)
    or n + 1 CSR offsets — without it every sample has exactly one id per table. An item with
    no sample (n = 0, no ids) is skipped."""

    def __init__(self, num_tables, num_dense):
        self.num_tables = num_tables
        self.num_dense = num_dense

    def __call__(self, item):
        if not isinstance(item, dict):
            raise ValueError(f"expected a dict with labels, dense, ids (and offsets), got "
                             f"{type(item).__name__}")
        if "labels" not in item or "ids" not in item:
            raise ValueError(f"a batch needs 'labels' and 'ids', got keys {sorted(item)}")
        labels = _array(item["labels"], np.float32, "labels")
        # One label a sample: [n], or the [n, 1] of a model's output; [n, 2] is not n samples,
        # and a scalar is no batch (ascontiguousarray made it [1]).
        if labels.ndim > 2 or (labels.ndim == 2 and labels.shape[1] != 1):
            raise ValueError(f"labels: expected shape (n,) or (n, 1), got {tuple(labels.shape)}")
        if np.ndim(item["labels"]) == 0:
            raise ValueError("labels: expected shape (n,) or (n, 1), got () (a scalar)")
        labels = labels.reshape(-1)
        n = labels.shape[0]
        if "dense" in item and item["dense"] is not None:
            dense = _array(item["dense"], np.float32, "dense")
        else:
            dense = np.zeros((n, 0), dtype=np.float32)
        if dense.ndim != 2 or dense.shape != (n, self.num_dense):
            raise ValueError(f"dense: expected shape ({n}, {self.num_dense}), got "
                             f"{tuple(dense.shape)}")
        ids = item["ids"]
        offsets = item.get("offsets")
        if not isinstance(ids, (list, tuple)) or len(ids) != self.num_tables:
            raise ValueError(f"ids: expected a list of {self.num_tables} arrays (one per "
                             f"table), got {type(ids).__name__}"
                             + (f" of {len(ids)}" if isinstance(ids, (list, tuple)) else ""))
        if offsets is not None and (not isinstance(offsets, (list, tuple))
                                    or len(offsets) != self.num_tables):
            raise ValueError(f"offsets: expected a list of {self.num_tables} arrays (one per "
                             f"table)")
        all_offsets = [np.zeros(1, dtype=np.int64)]
        all_ids = []
        base = 0
        for t in range(self.num_tables):
            table_ids = _array(ids[t], np.int64, f"ids of table {t}").reshape(-1)
            if offsets is None:
                if table_ids.shape[0] != n:
                    raise ValueError(f"table {t}: {table_ids.shape[0]} ids for {n} samples "
                                     f"(without offsets every sample has one id)")
                bag = np.arange(1, n + 1, dtype=np.int64)
            else:
                starts = _array(offsets[t], np.int64, f"offsets of table {t}").reshape(-1)
                if starts.shape[0] == n:
                    starts = np.append(starts, table_ids.shape[0])
                if starts.shape[0] != n + 1:
                    raise ValueError(f"table {t}: {starts.shape[0]} offsets for {n} samples "
                                     f"(expected {n} bag starts or {n + 1} CSR offsets)")
                if starts[0] != 0 or starts[-1] != table_ids.shape[0] or \
                        np.any(np.diff(starts) < 0):
                    raise ValueError(f"table {t}: offsets must start at 0, never decrease and "
                                     f"end at the number of ids ({table_ids.shape[0]})")
                bag = starts[1:]
            all_offsets.append(bag + base)
            all_ids.append(table_ids)
            base += table_ids.shape[0]
        return (dense, labels, np.concatenate(all_offsets),
                np.concatenate(all_ids) if all_ids else np.zeros(0, dtype=np.int64))
