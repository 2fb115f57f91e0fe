"""A batch of examples as the model sees it: labels, sparse fields as bags of ids (CSR), numeric features.

    Bags    one sparse field of n examples in CSR form:
            ids      uint64  (nnz,)     the ids of every example, example after example
            offsets  int64   (n + 1,)   example i holds ids[offsets[i]:offsets[i + 1]]; offsets[0] = 0,
                                        non-decreasing, offsets[n] = nnz; an empty bag is allowed
            weights  float32 (nnz,) or None (every id weighs 1)
            A categorical field is a bag of exactly one id per example (Bags.one_per_example).
    Batch   labels float32 (n,) in {0, 1}, or NaN for every example of a file without labels (read only by
            `ps-worker predict`); fields {field name: Bags}, in schema order; dense float32 (n, D) or None; probs
            float64 (n,) (the true click probabilities of synthetic data) or None; line_nos int64 (n,) (the 1-based
            physical line of each example in the file it was read from) or None; file_nos int32 (n,) (the file
            each example was read from: files[file_nos[i]]) or None, with files, the names it indexes.

Which table a field looks up is the model's business (worker/models/spec.py FieldSpec.table); table_ids groups
a batch's fields by table and deduplicates the ids of each table across all of its fields, as the client pulls
and pushes them: one unique id, one row, one summed gradient.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numba
import numpy as np

from ps.hashing import mix64_scalar


@dataclass
class Bags:
    """One sparse field of n examples (see the module docstring)."""

    ids: np.ndarray
    offsets: np.ndarray
    weights: np.ndarray | None = None
    _one_each = None  # is_one_per_example(), once known (bags are not changed after they are made)

    def __post_init__(self) -> None:
        self.ids = np.asarray(self.ids, dtype=np.uint64)
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        if self.offsets.ndim != 1 or len(self.offsets) < 1 or self.offsets[0] != 0:
            raise ValueError(f"offsets must be a 1-d array starting at 0, got {self.offsets[:4]}...")
        if self.ids.ndim != 1 or self.offsets[-1] != len(self.ids):
            raise ValueError(f"offsets end at {self.offsets[-1]}, but there are {self.ids.shape} ids")
        if (self.offsets[1:] < self.offsets[:-1]).any():
            raise ValueError("offsets must be non-decreasing")
        if self.weights is not None:
            self.weights = np.asarray(self.weights, dtype=np.float32)
            if self.weights.shape != self.ids.shape:
                raise ValueError(f"weights have shape {self.weights.shape}, ids {self.ids.shape}")

    @staticmethod
    def one_per_example(ids: np.ndarray) -> Bags:
        """A categorical field: example i holds ids[i] alone."""
        ids = np.asarray(ids, dtype=np.uint64).ravel()
        return Bags._valid(ids, np.arange(len(ids) + 1, dtype=np.int64), None, True)

    @staticmethod
    def _valid(ids: np.ndarray, offsets: np.ndarray, weights: np.ndarray | None, one_each: bool | None = None) -> Bags:
        """Bags of arrays already known valid (parts of valid bags), without __post_init__'s checks; one_each:
        is_one_per_example() where known."""
        bags = object.__new__(Bags)
        bags.ids, bags.offsets, bags.weights = ids, offsets, weights
        if one_each is not None:
            bags._one_each = one_each
        return bags

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def is_one_per_example(self) -> bool:
        """Whether every example holds exactly one id, unweighted (a categorical field)."""
        if self._one_each is None:
            self._one_each = self.weights is None and len(self.ids) == len(self) and bool((self.lengths() == 1).all())
        return self._one_each

    def lengths(self) -> np.ndarray:
        """int64 (n,): ids per example."""
        return np.diff(self.offsets)

    def example_of_each_id(self) -> np.ndarray:
        """int64 (nnz,): the example each id belongs to."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.lengths())

    def slice(self, lo: int, hi: int) -> Bags:
        """Examples [lo, hi)."""
        a, b = int(self.offsets[lo]), int(self.offsets[hi])
        weights = None if self.weights is None else self.weights[a:b]
        return Bags._valid(self.ids[a:b], self.offsets[lo : hi + 1] - a, weights, self._one_each or None)

    def take(self, examples: np.ndarray) -> Bags:
        """The bags of the given examples (int indices), in that order."""
        examples = np.asarray(examples, dtype=np.int64)
        starts, lengths = self.offsets[examples], self.lengths()[examples]
        offsets = np.zeros(len(examples) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        positions = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        weights = None if self.weights is None else self.weights[positions]
        return Bags._valid(self.ids[positions], offsets, weights, self._one_each or None)

    @staticmethod
    def concat(parts: Sequence[Bags]) -> Bags:
        """The examples of every part, in order (weights: 1 where a part has none, if any part has them)."""
        if len(parts) == 1:
            return parts[0]
        offsets = [np.zeros(1, dtype=np.int64)]
        base = 0
        for p in parts:
            offsets.append(p.offsets[1:] + base)
            base += len(p.ids)
        weights = None
        if any(p.weights is not None for p in parts):
            weights = np.concatenate(
                [p.weights if p.weights is not None else np.ones(len(p.ids), np.float32) for p in parts]
            )
        one_each = all(p._one_each for p in parts) or None  # None: not known
        return Bags._valid(np.concatenate([p.ids for p in parts]), np.concatenate(offsets), weights, one_each)


@dataclass
class Batch:
    """n examples (see the module docstring)."""

    labels: np.ndarray
    fields: dict[str, Bags]
    dense: np.ndarray | None = None
    probs: np.ndarray | None = None
    line_nos: np.ndarray | None = None
    file_nos: np.ndarray | None = None
    files: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.float32)
        n = len(self.labels)
        if self.labels.shape != (n,):
            raise ValueError(f"labels have shape {self.labels.shape}, expected ({n},)")
        for name, bags in self.fields.items():
            if len(bags) != n:
                raise ValueError(f"field {name!r} has {len(bags)} examples, the labels {n}")
        if self.probs is not None and self.probs.shape != (n,):
            raise ValueError(f"probs has shape {self.probs.shape}, expected ({n},)")
        if self.line_nos is not None and self.line_nos.shape != (n,):
            raise ValueError(f"line_nos has shape {self.line_nos.shape}, expected ({n},)")
        if self.file_nos is not None and self.file_nos.shape != (n,):
            raise ValueError(f"file_nos has shape {self.file_nos.shape}, expected ({n},)")
        if self.dense is not None and (self.dense.ndim != 2 or self.dense.shape[0] != n):
            raise ValueError(f"dense has shape {self.dense.shape}, expected ({n}, features)")

    def __len__(self) -> int:
        return len(self.labels)

    def nbytes(self) -> int:
        """The bytes of its arrays (labels, every field's ids, offsets and weights, dense, probs, line and file
        numbers)."""
        arrays = [self.labels, self.dense, self.probs, self.line_nos, self.file_nos]
        arrays += [a for bags in self.fields.values() for a in (bags.ids, bags.offsets, bags.weights)]
        return sum(a.nbytes for a in arrays if a is not None)

    def dense_or_empty(self) -> np.ndarray:
        """dense, or an (n, 0) array when the data has no numeric features."""
        return self.dense if self.dense is not None else np.zeros((len(self), 0), dtype=np.float32)

    def slice(self, lo: int, hi: int) -> Batch:
        """Examples [lo, hi)."""
        return Batch(
            self.labels[lo:hi],
            {name: bags.slice(lo, hi) for name, bags in self.fields.items()},
            None if self.dense is None else self.dense[lo:hi],
            None if self.probs is None else self.probs[lo:hi],
            None if self.line_nos is None else self.line_nos[lo:hi],
            None if self.file_nos is None else self.file_nos[lo:hi],
            self.files,
        )

    def take(self, examples: np.ndarray) -> Batch:
        """The given examples (int indices), in that order."""
        return Batch(
            self.labels[examples],
            {name: bags.take(examples) for name, bags in self.fields.items()},
            None if self.dense is None else self.dense[examples],
            None if self.probs is None else self.probs[examples],
            None if self.line_nos is None else self.line_nos[examples],
            None if self.file_nos is None else self.file_nos[examples],
            self.files,
        )

    @staticmethod
    def concat(parts: Sequence[Batch]) -> Batch:
        """The examples of every part, in order (the parts have the same fields; their files' names kept where every
        part indexes the same names, as the batches of one read do, else none: _joined_files)."""
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        files, file_nos = _joined_files(parts)
        return Batch(
            np.concatenate([p.labels for p in parts]),
            {name: Bags.concat([p.fields[name] for p in parts]) for name in first.fields},
            None if first.dense is None else np.concatenate([p.dense for p in parts]),
            None if first.probs is None else np.concatenate([p.probs for p in parts]),
            None if first.line_nos is None else np.concatenate([p.line_nos for p in parts]),
            file_nos,
            files,
        )

    def file_of(self, i: int) -> str | None:
        """The name of the file example i was read from; None where the batch does not know it."""
        return None if self.file_nos is None else self.files[int(self.file_nos[i])]


def _joined_files(parts: Sequence[Batch]) -> tuple[tuple[str, ...], np.ndarray | None]:
    """(files, file_nos) of Batch.concat(parts): the parts' file numbers as they are where every part indexes the
    same names (every producer, worker/formats.py's read, gives its batches one files tuple); ((), None), no file
    names, where a part has none or the parts' names differ."""
    files = parts[0].files
    if any(p.file_nos is None for p in parts) or not all(p.files is files or p.files == files for p in parts):
        return (), None
    return files, np.concatenate([p.file_nos for p in parts])


@dataclass
class TableIds:
    """The ids one table serves in a batch: uniq uint64 (u,) sorted; index {field: int64 (nnz_f,)}, the
    position in uniq of each id of the field; shows and clicks float32 (u,): occurrences of each id, and
    those of them in clicked examples."""

    uniq: np.ndarray
    index: dict[str, np.ndarray]
    shows: np.ndarray
    clicks: np.ndarray


def table_ids(batch: Batch, field_tables: Mapping[str, str]) -> dict[str, TableIds]:
    """{table: TableIds} of a batch, field_tables mapping each field of the batch to its table."""
    by_table: dict[str, list[str]] = {}
    for name in batch.fields:
        by_table.setdefault(field_tables[name], []).append(name)
    out = {}
    for table, names in by_table.items():
        bags = [batch.fields[name] for name in names]
        uniq, inverse = unique_inverse(np.concatenate([b.ids for b in bags]))
        # a bag of one id per example (the common categorical field) labels its ids with the labels as they are
        labels = np.concatenate(
            [batch.labels if b.is_one_per_example() else batch.labels[b.example_of_each_id()] for b in bags]
        )
        index, at = {}, 0
        for name, b in zip(names, bags):
            index[name] = inverse[at : at + len(b.ids)]
            at += len(b.ids)
        shows = np.bincount(inverse, minlength=len(uniq)).astype(np.float32)
        clicks = np.bincount(inverse, weights=labels, minlength=len(uniq)).astype(np.float32)
        out[table] = TableIds(uniq, index, shows, clicks)
    return out


def unique_inverse(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(uniq, inverse) as np.unique(ids, return_inverse=True) gives them (uniq sorted, inverse int64 with
    uniq[inverse] == ids), found with a hash table: a batch's ids repeat, so sorting its few unique ids beats
    sorting all of them."""
    seen, inverse = _first_seen(np.ascontiguousarray(ids, dtype=np.uint64))
    order = np.argsort(seen)
    rank = np.empty(len(seen), dtype=np.int64)
    rank[order] = np.arange(len(seen), dtype=np.int64)
    return seen[order], rank[inverse]


@numba.njit(nogil=True, cache=True)
def _first_seen(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct ids in the order first seen, the position of each id among them): open addressing on
    mix64, the table kept at most half full (grown 4x, its entries put again)."""
    n = len(ids)
    cap = 1024
    slots = np.full(cap, -1, np.int64)
    seen = np.empty(n, np.uint64)
    inverse = np.empty(n, np.int64)
    u = 0
    for i in range(n):
        x = ids[i]
        mask = np.uint64(cap - 1)
        h = mix64_scalar(x) & mask
        while True:
            s = slots[h]
            if s < 0:
                slots[h], seen[u], inverse[i] = u, x, u
                u += 1
                if 2 * u > cap:
                    cap *= 4
                    slots = np.full(cap, -1, np.int64)
                    mask = np.uint64(cap - 1)
                    for k in range(u):
                        g = mix64_scalar(seen[k]) & mask
                        while slots[g] >= 0:
                            g = (g + np.uint64(1)) & mask
                        slots[g] = k
                break
            if seen[s] == x:
                inverse[i] = s
                break
            h = (h + np.uint64(1)) & mask
    return seen[:u], inverse


def rebatch(parts: Iterable[Batch], size: int) -> Iterator[Batch]:
    """Batches of exactly `size` examples (the last may be smaller) from parts of any size, in order."""
    pending: list[Batch] = []
    count = 0
    for part in parts:
        if len(part) == 0:
            continue
        if not pending and len(part) == size:
            yield part
            continue
        pending.append(part)
        count += len(part)
        if count >= size:
            whole = Batch.concat(pending)
            lo = 0
            while count - lo >= size:
                yield whole.slice(lo, lo + size)
                lo += size
            pending = [whole.slice(lo, count)] if lo < count else []
            count -= lo
    if pending:
        yield Batch.concat(pending)
