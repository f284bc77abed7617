"""Jobs and trainers: the pull-style API a PyTorch training loop drives (see the package doc)."""

import atexit
import collections.abc
import ctypes
import errno
import fcntl
import hashlib
import io
import json
import numbers
import operator
import os
import signal
import socket
import sys
import threading
import traceback
import warnings
import weakref

import numpy as np
import torch
from torch.utils.dlpack import from_dlpack

from bagpipe import _core
from bagpipe import data as _data
from bagpipe.errors import ConfigError, JobError, Stopped, UsageError

Schema = _core.Schema


def parse_train_args(args=None, prog="dlrm_pytorch.py", description=""):
    """Parses ``bagpipe train``'s flags (same names, defaults, checks and --help).

    Returns ``(Config, other)`` where ``other`` holds the flags that are not job options:
    model, bottom, top, out, metrics_out, metrics_interval, summary_json, dump_params, quiet.
    --help prints the help and exits; a malformed flag exits with status 2; options that
    contradict each other raise ConfigError.
    """
    if args is None:
        args = sys.argv[1:]
    args = [_check_text(str(a), f"parse_train_args: argument {i}", ConfigError, nul=False)
            for i, a in enumerate(args)]
    config, other = _core.parse_train_args(args, prog, description)
    config = Config._of(config)
    for name in _OPTION_KINDS:  # the flags' values pass the checks a Config's setters make (NUL)
        _check_option(name, getattr(config, name))
    return config, dict(other)


def _check_text(text, what, error=ValueError, nul=True):
    """``text`` (a str) if the runtime can take it whole; else ``error`` naming ``what``: a NUL
    (checked unless ``nul`` is False) would end it there (a C string), and what UTF-8 cannot
    encode (a lone surrogate, as a filename decoded with surrogateescape holds) fails
    pybind11's conversion."""
    if nul and "\0" in text:
        raise error(f"{what}: {text!r} contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as problem:
        raise error(f"{what}: {text!r} cannot be encoded as UTF-8 ({problem.reason}: "
                    f"{text[problem.start]!r} at index {problem.start})") from None
    return text


def _message_text(message):
    """A message for the runtime, kept whole: NUL spelled \\0 (the message would end there) and
    what UTF-8 cannot encode (a lone surrogate) escaped with a backslash."""
    text = str(message).replace("\0", "\\0")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _describe(error):
    """``Type: message`` of an exception, even one whose __str__ raises."""
    try:
        text = str(error)
    except Exception as problem:  # a hostile __str__: the type still names the root cause
        text = f"<str() raised {type(problem).__name__}>"
    return f"{type(error).__name__}: {text}"


def _where(error):
    """`` (at FILE:LINE in FUNCTION)`` of the innermost frame of ``error``'s traceback, or
    nothing: where a loop's exception came from, in the one line the job's abort prints."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    frame = frames[-1]
    return f" (at {frame.filename}:{frame.lineno} in {frame.name})"


# Every Config option by kind, as _core.Config stores it (trainer_hooks/job_config.h): values
# are checked here so that a wrong type names the option (pybind11's own error does not), a bool
# is no int, an int no bool, and a string holds no NUL (a path would end there) and is valid
# UTF-8 (no lone surrogate).
_INT_RANGES = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1),
               "uint64": (0, 2**64 - 1)}
_OPTION_KINDS = {
    "data": "str", "schema": "str", "skip_bad_lines": "bool", "row_budget": "int64",
    "max_samples": "int64", "batch_size": "int64", "iterations": "int64", "epochs": "int32",
    "eval_fraction": "float", "trainers": "int32", "servers": "int32", "device": "str",
    "server_link": "str", "peer_timeout": "float", "cache": "str", "cache_rows": "int64",
    "lookahead": "int32", "prefetch_depth": "int32", "plan_queue_depth": "int32",
    "writeback_horizon": "int64", "oracle_split_parts": "int32",
    "oracle_split_min_rows": "int64", "dim": "int32", "optimizer": "str", "lr": "float",
    "eps": "float", "initial_accumulator": "float", "dense_optimizer": "str?",
    "dense_lr": "float?", "dense_eps": "float?", "dense_initial_accumulator": "float?",
    "seed": "uint64", "deterministic": "bool", "collect_parameters": "bool",
    "checkpoint_dir": "path", "checkpoint_every": "int64", "keep_checkpoints": "int32",
    "resume": "path",
}


def _strict_int(value, low, high, wrong, out_of_range):
    """``value`` as an int in [low, high]; raises ``wrong()`` for a bool, a float, a string or
    anything else that is not an integer (int() would truncate 4.7 or parse "4"), and
    ``out_of_range()`` outside the range."""
    if isinstance(value, (bool, np.bool_)):
        raise wrong()
    try:
        value = operator.index(value)
    except TypeError:
        raise wrong() from None
    if not low <= value <= high:
        raise out_of_range()
    return value


def _check_option(name, value):
    """``value`` as option ``name`` takes it; TypeError (wrong type) or ConfigError (out of
    range, NUL or a lone surrogate in a string) naming the option."""
    kind = _OPTION_KINDS[name]
    if kind.endswith("?"):
        if value is None:
            return None
        kind = kind[:-1]

    def wrong(expected):
        return TypeError(f"Config.{name}: expected {expected}, got {type(value).__name__} "
                         f"{value!r:.80}")

    if kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise wrong("a bool")
        return bool(value)
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        return _strict_int(value, low, high, lambda: wrong("an int"),
                           lambda: ConfigError(f"Config.{name}: {value} is out of range "
                                               f"[{low}, {high}]"))
    if kind == "float":
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise wrong("a number")
        try:
            return float(value)
        except OverflowError:
            raise ConfigError(f"Config.{name}: an int of {value.bit_length()} bits is out of "
                              "range (a float)") from None
    if kind == "path" and isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise wrong("a str" + (" or a path" if kind == "path" else "")
                    + (" or None" if _OPTION_KINDS[name].endswith("?") else ""))
    return _check_text(value, f"Config.{name}", ConfigError)


class Config(_core.Config):
    """Every option of a job: ``bagpipe train``'s flags with ``_`` for ``-`` (``--cache-rows``
    is ``cache_rows``; the CSV column spec ``--schema`` is ``schema``). Unset options keep the
    command's defaults. ``dense_optimizer``, ``dense_lr``, ``dense_eps`` and
    ``dense_initial_accumulator`` are None unless set (then the embedding optimizer's apply).
    Each value is type-checked as it is set (TypeError naming the option; an unknown option is
    a TypeError too, never a new attribute); the options are checked as a whole when a Job
    starts (ConfigError names the options)."""

    def __init__(self, **options):
        super().__init__()
        for name, value in options.items():
            setattr(self, name, value)

    def __setattr__(self, name, value):
        if name not in _OPTION_KINDS:
            raise TypeError(f"Config: unknown option {name!r}")
        super().__setattr__(name, _check_option(name, value))
        if name == "checkpoint_every":  # set, 0 included: a resume keeps it (not the checkpoint's)
            _core.Config.__dict__["_checkpoint_every_given"].__set__(self, True)

    @classmethod
    def _of(cls, core_config):
        """A Config holding the options of a _core.Config (a copy)."""
        config = cls()
        for name in (*_OPTION_KINDS, "_checkpoint_every_given"):
            _core.Config.__dict__[name].__set__(config, getattr(core_config, name))
        return config

    def copy(self):
        return Config._of(self)

    def __repr__(self):
        return f"bagpipe.Config({self.to_json()})"


def _json_text(value, what):
    """``value`` as JSON text for the runtime; TypeError/ValueError naming ``what`` (strict
    JSON: NaN and infinities have no spelling there, nor a lone surrogate in a string)."""
    try:
        text = json.dumps(value if value is not None else {}, allow_nan=False,
                          ensure_ascii=False)
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"{what}: a string cannot be encoded as UTF-8 ({error.reason}: "
                         f"{error.object[error.start]!r})") from None
    except (TypeError, ValueError) as error:
        raise type(error)(f"{what}: {error}") from None
    return text


def _identity_text(value, what):
    """A checkpoint identity's part for the runtime: a dict (or None) as JSON text; a callable as
    one that takes the data's Schema and returns that text."""
    if callable(value):
        return lambda schema: _json_text(value(schema), what)
    return _json_text(value, what)


def _path_text(path, what):
    """A path argument as the runtime takes it ("" for None); TypeError when it is no path,
    ValueError on a NUL or what UTF-8 cannot encode."""
    if path is None:
        return ""
    try:
        path = os.fspath(path)
    except TypeError:
        raise TypeError(f"{what}: expected a str or a path, got {type(path).__name__}") from None
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    return _check_text(path, what)


def _check_output_file(path, what):
    """ValueError naming ``what`` when a file cannot be created at ``path`` (a directory, or
    its directory missing): checked before the job ends, so that the caller can retry."""
    if os.path.isdir(path):
        raise ValueError(f"{what}: {path!r} is a directory")
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise ValueError(f"{what}: cannot create {path!r}: its directory {parent!r} "
                         + ("is not a directory" if os.path.exists(parent) else "does not exist"))


def _make_directory(path, what):
    """Creates directory ``path`` (and its parents); ValueError naming ``what`` when it
    cannot (a file there, no permission)."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise ValueError(f"{what}: cannot create the directory {path!r}: "
                         f"{error.strerror or error}") from None


class RunDirectoryLock:
    """Holds a run directory for one job, as ``bagpipe train --out DIR`` does: an exclusive
    flock(2) on DIR/.bagpipe-run.lock (the same file and lock, so a ``bagpipe train`` and a
    Python job on one directory exclude each other too) holding the owner's pid. The directory
    is created if missing. Raises ConfigError naming the pid when another job holds it; on a file
    system without flock the lock is skipped with a warning (as in C++). Released by
    ``release()``, on leaving a ``with`` block, or when the process ends (even by SIGKILL)."""

    NAME = ".bagpipe-run.lock"
    _held = {}  # realpath of a directory -> how many RunDirectoryLocks of this process hold it

    @classmethod
    def held_here(cls, path):
        """Whether a RunDirectoryLock of this process holds ``path``."""
        return cls._held.get(os.path.realpath(path), 0) > 0

    def __init__(self, path):
        path = _path_text(path, "RunDirectoryLock")
        if not path:
            raise ValueError("RunDirectoryLock: the path is empty")
        _make_directory(path, "RunDirectoryLock")
        self.path = os.path.join(path, self.NAME)
        self._real = None
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = os.pread(self._fd, 31, 0).decode("ascii", "replace").strip()
            os.close(self._fd)
            self._fd = -1
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                who = f"pid {holder}" if holder.isdigit() else "a process"
                raise ConfigError(f"run directory {path} is in use by another job ({who} holds "
                                  f"the lock {self.path!r}): two jobs writing one directory "
                                  "would replace each other's files; wait for it to end or use "
                                  "another directory") from None
            warnings.warn(f"run directory {path}: cannot lock {self.path!r} ({error.strerror}): "
                          "going on without a lock; no other job may write this directory")
            return
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)
        self._real = os.path.realpath(path)
        RunDirectoryLock._held[self._real] = RunDirectoryLock._held.get(self._real, 0) + 1

    def release(self):
        """Releases the lock (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._real is not None:
            RunDirectoryLock._held[self._real] -= 1
            if RunDirectoryLock._held[self._real] == 0:
                del RunDirectoryLock._held[self._real]
            self._real = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def __del__(self):
        self.release()


class MetricsWriter:
    """Writes dicts as JSON lines (metrics.jsonl, read by ``bagpipe compare``). The file starts
    empty at the first write, unless ``start(k)`` said otherwise first; ``replaces``: the same
    run's other outputs (its summary.json, params.bin) that the earlier run written there left,
    removed at a fresh start, so that a run that fails leaves no summary its metrics
    contradict."""

    def __init__(self, path, replaces=()):
        path = _path_text(path, "MetricsWriter")
        if not path:
            raise ValueError("MetricsWriter: the path is empty")
        if os.path.isdir(path):
            raise IsADirectoryError(f"MetricsWriter: {path!r} is a directory")
        if isinstance(replaces, (str, bytes, os.PathLike)):
            raise TypeError("MetricsWriter: replaces must be a list of paths, not one path")
        replaces = [_path_text(p, "MetricsWriter replaces") for p in replaces]
        self._writer = _core.MetricsWriter(path, replaces)
        # The first lines of the checkpointed run's metrics files (Trainer.checkpoint_torch_state
        # with metrics=this writer sets them when the job resumes); None: not known.
        self._resumed_first_lines = None

    def start(self, keep_through_iteration=None):
        """Starts the file, at most once and before the first write; pass
        ``trainer.first_iteration``. A job resumed at iteration K > 0 keeps the earlier file's
        lines up to iteration K (and lines without an "iteration"), later ones go, as ``bagpipe
        train --resume`` keeps its metrics; 0 (a fresh job) or ``None``: the file starts empty,
        as at the first write. The file is replaced atomically either way. When the checkpoint
        says what the run's files started with (``Trainer.checkpoint_torch_state(...,
        metrics=writer)``), a file of another run (none of those first lines, and lines before
        K) raises UsageError and is left as it is, rather than have two runs' lines spliced;
        start may then be called again."""
        keep = -1 if keep_through_iteration is None else _strict_int(
            keep_through_iteration, -2**63, 2**63 - 1,
            lambda: TypeError(f"MetricsWriter.start: keep_through_iteration must be an int, "
                              f"got {type(keep_through_iteration).__name__}"),
            lambda: ValueError("MetricsWriter.start: keep_through_iteration is out of range"))
        self._writer.start(keep if keep > 0 else -1,
                           self._resumed_first_lines if keep > 0 else None)

    @property
    def first_lines(self):
        """The CRC32C of the first line of each metrics file the run wrote (this one once it has
        a line, and those of the run it resumed): what a checkpoint records so that a resumed
        job recognises the run's files (see start)."""
        return self._writer.first_lines

    def write(self, record):
        self._writer.write_json(_json_text(record, "MetricsWriter.write"))


def initial_embedding_weights(config, schema):
    """The tables' initial rows as the embedding servers create them: a list of float32
    tensors [rows, dim], one per table (to start a pure-PyTorch model from the same point)."""
    if not isinstance(config, _core.Config):
        raise TypeError(f"initial_embedding_weights: config must be a bagpipe.Config, got "
                        f"{type(config).__name__}")
    if not isinstance(schema, Schema):
        raise TypeError(f"initial_embedding_weights: schema must be a bagpipe.Schema, got "
                        f"{type(schema).__name__}")
    rows = list(schema.table_rows)
    return [torch.from_numpy(_core.initial_rows(config.seed, config.dim, rows, t))
            for t in range(len(rows))]


def _int_argument(function, name, value, low=-2**31, high=2**31 - 1):
    """``value`` as the int argument ``name`` of ``function`` (_strict_int): a TypeError naming
    both, or a ConfigError outside [low, high] (the C++ argument's range)."""
    return _strict_int(
        value, low, high,
        lambda: TypeError(f"{function}: {name} must be an int, got {type(value).__name__} "
                          f"{value!r:.80}"),
        lambda: ConfigError(f"{function}: {name} = {value} is out of range [{low}, {high}]"))


def _int_list_argument(function, name, values):
    """``values`` (an iterable of ints, not a string) as a list; TypeError otherwise."""
    if isinstance(values, (str, bytes)) or not isinstance(values, collections.abc.Iterable):
        raise TypeError(f"{function}: {name} must be a list of ints, got "
                        f"{type(values).__name__} {values!r:.80}")
    return [_int_argument(function, f"{name}[{k}]", v) for k, v in enumerate(values)]


def initial_dense_parameters(num_dense, num_tables, dim, bottom, top, seed):
    """The layers of ``bagpipe train --model dlrm``'s dense model as it starts them: a list of
    (weight [out, in], bias [out]) float32 tensors, the bottom MLP's layers then the top MLP's
    (``bottom`` from num_dense to dim; ``top`` after the dot interaction, ending in 1). A
    torch.nn DLRM loaded with them starts where the C++ one does."""
    f = "initial_dense_parameters"
    return [(torch.from_numpy(weight), torch.from_numpy(bias))
            for weight, bias in _core.initial_dense_parameters(
                _int_argument(f, "num_dense", num_dense),
                _int_argument(f, "num_tables", num_tables), _int_argument(f, "dim", dim),
                _int_list_argument(f, "bottom", bottom), _int_list_argument(f, "top", top),
                _int_argument(f, "seed", seed, 0, 2**64 - 1))]


def initial_logreg_parameters(num_tables, dim, seed):
    """``bagpipe train --model logreg``'s initial (weight [1, tables * dim], bias [1])."""
    f = "initial_logreg_parameters"
    weight, bias = _core.initial_logreg_parameters(_int_argument(f, "num_tables", num_tables),
                                                   _int_argument(f, "dim", dim),
                                                   _int_argument(f, "seed", seed, 0, 2**64 - 1))
    return torch.from_numpy(weight), torch.from_numpy(bias)


class Batch:
    """One iteration's local batch: ``dense`` [n, num_dense] and ``labels`` [n] (float32 tensors
    on the trainer's device, owned by the caller), ``num_samples`` (n, this trainer's share),
    ``global_batch_size`` (all trainers' samples), ``iteration``, ``pooled`` (the pooled
    embeddings, looked up on first access). The sparse ids stay in the runtime (already turned
    into cache slots by the oracle): :class:`EmbeddingBags` turns them into pooled embeddings
    that train."""

    __slots__ = ("trainer", "iteration", "num_samples", "global_batch_size", "dense", "labels",
                 "is_eval", "_pooled")

    def __init__(self, trainer, iteration, num_samples, global_batch_size, dense, labels,
                 is_eval):
        self.trainer = trainer
        self.iteration = iteration
        self.num_samples = num_samples
        self.global_batch_size = global_batch_size
        self.dense = dense
        self.labels = labels
        self.is_eval = is_eval
        self._pooled = None

    @property
    def pooled(self):
        """The pooled embeddings [n, tables, dim], looked up at the first access (no autograd:
        to train them use EmbeddingBags, or hand the gradient to trainer.end_iteration)."""
        if self._pooled is None:
            self.trainer._check_current(self, "Batch.pooled")
            self._pooled = self.trainer.lookup_pooled()
        return self._pooled

    def __repr__(self):
        kind = "eval batch" if self.is_eval else "iteration"
        return (f"bagpipe.Batch({kind} {self.iteration}, {self.num_samples} of "
                f"{self.global_batch_size} samples, trainer {self.trainer.id})")


class Trainer:
    """One trainer of the job, driven by one thread (its calls raise UsageError when another
    thread is inside one). Iterating over it runs ``begin_iteration`` until training ends.

    Per iteration: ``begin_iteration()`` -> Batch; ``lookup_pooled()`` (or EmbeddingBags) ->
    pooled embeddings [n, tables, dim]; forward/backward; ``end_iteration(pooled_grad)`` (done
    by EmbeddingBags' backward); ``all_reduce_gradients(params)`` / ``all_reduce_(tensor)`` for
    the dense gradients, every trainer in the same order. After the last: ``flush()``, then
    optionally ``eval_batches()``, then ``complete(...)``. See the package doc for the device
    contract."""

    def __init__(self, core, num_tables, num_dense, dim):
        self._core = core
        self.id = core.id
        self.num_trainers = core.num_trainers
        self.device = torch.device(core.device)
        self.num_tables = num_tables
        self.num_dense = num_dense
        self.dim = dim
        self._cuda = self.device.type == "cuda"
        self._batch = None
        # The thread driving the loop, and a gradient handed over by autograd on another thread
        # (see _end_iteration_from_backward), which the loop's thread hands to the runtime.
        self._loop_thread = None
        self._pending_grad = None
        # Counts begin_iteration calls: EmbeddingBags' output remembers the one it came from, so
        # a backward through an earlier iteration's graph cannot end the current iteration.
        self._generation = 0
        # EmbeddingBags' node that ends the iteration (generation, its output), which every
        # lookup of the iteration hangs from; the generation whose backward ended it.
        self._end_node = None
        self._ended = -1
        # flush() or complete() succeeded: this trainer's training ended (run_trainers checks).
        self._flushed = False
        # all_reduce_gradients compared the trainers' dense replicas (at its first call).
        self._replicas_checked = False

    def __repr__(self):
        return f"bagpipe.Trainer({self.id} of {self.num_trainers}, {self.device})"

    def _register_stream(self):
        if self._cuda:
            self._core.set_external_stream(torch.cuda.current_stream(self.device).cuda_stream)

    def _check_current(self, batch, what):
        """UsageError naming ``what`` unless ``batch`` is this trainer's current batch: the
        runtime holds the rows of that one only (another's lookup would get them)."""
        if batch.trainer is not self:
            raise UsageError(f"{what}: {batch!r} belongs to another trainer, not to trainer "
                             f"{self.id} (each trainer looks up its own batches)")
        if batch is not self._batch:
            raise UsageError(f"{what}: {batch!r} is not trainer {self.id}'s current batch (its "
                             "latest begin_iteration's or eval batch): the runtime holds the "
                             "current batch's rows only")

    def _make_batch(self, info, is_eval):
        # The tensors come from the trainer's buffer pool (no allocation in the steady state);
        # a buffer is reused only after every tensor viewing it is gone.
        iteration, n, global_size, dense, labels = info
        self._batch = Batch(self, iteration, n, global_size, from_dlpack(dense),
                            from_dlpack(labels), is_eval)
        return self._batch

    def _end_pending(self):
        """Ends the iteration whose gradient autograd handed over on another thread, here on
        the loop's thread (with its PyTorch stream, where the backward pass was queued)."""
        grad = self._pending_grad
        if grad is not None:
            self._pending_grad = None
            self._register_stream()
            try:
                self._core.end_iteration(grad)
            except BaseException:
                # Still open (e.g. a non-finite gradient): EmbeddingBags may look up anew, as
                # after a refused backward on the loop's thread.
                self._ended = -1
                self._end_node = None
                raise

    def _end_iteration_from_backward(self, pooled_grad, generation):
        """EmbeddingBags' backward. Autograd runs the backward of CUDA operations on its own
        thread for the device, one thread that every trainer on that GPU shares: if it ended the
        iteration there, a trainer waiting for the others' shared-row gradients would hold that
        thread while the others' backward passes wait behind it. So a backward on a thread other
        than the loop's hands the gradient over, and the loop's thread ends the iteration at its
        next call (all_reduce_gradients, all_reduce_, begin_iteration, flush, stats, complete).
        On the CPU autograd runs on the loop's thread, which ends the iteration at once."""
        if generation != self._generation:
            raise UsageError(f"trainer {self.id}: EmbeddingBags' output of an earlier iteration "
                             "was backpropagated (each batch's output is backpropagated in its "
                             "own iteration, before the next begin_iteration)")
        if self._ended == generation:
            raise UsageError(f"trainer {self.id}: EmbeddingBags' output was backpropagated twice "
                             "in one iteration (the first backward pass ended it and applied "
                             "its gradient; nothing more was applied): sum the losses and call "
                             "backward once per iteration")
        if self._loop_thread is None or threading.get_ident() == self._loop_thread:
            try:
                self._core.end_iteration(pooled_grad)
            except BaseException:
                self._end_node = None  # still open (e.g. a non-finite gradient): look up anew
                raise
        else:
            self._pending_grad = pooled_grad
        self._ended = generation

    def begin_iteration(self):
        """Waits for the next iteration's plan and rows; returns its Batch, or None when
        training has ended (then call flush())."""
        self._loop_thread = threading.get_ident()
        self._end_pending()
        self._register_stream()
        info = self._core.begin_iteration()
        self._generation += 1
        self._end_node = None
        if info is None:
            self._batch = None
            return None
        return self._make_batch(info, False)

    def __iter__(self):
        while True:
            batch = self.begin_iteration()
            if batch is None:
                return
            yield batch

    def lookup_pooled(self, out=None):
        """The current batch's pooled (sum) embeddings: a float32 tensor [n, tables, dim] of the
        caller's (a pooled buffer of the trainer's, reused once no tensor views it), or written
        into ``out`` (contiguous float32 on the trainer's device) and returned."""
        if out is not None:
            self._core.lookup_pooled_into(out)
            return out
        return from_dlpack(self._core.lookup_pooled())

    def end_iteration(self, pooled_grad):
        """Ends the iteration with d(loss)/d(pooled): a contiguous float32 tensor [n, tables,
        dim] on the trainer's device. Reduces it to row gradients, exchanges those of shared rows
        with the other trainers and applies the embedding optimizer. On the CPU a NaN or
        infinite element, or one so large that a row's sum over the batch's ids and the trainers
        (scaled by SGD's learning rate, squared by Adagrad) could overflow float32, raises
        ValueError before anything is applied (the iteration stays open); a CUDA gradient is not
        checked (that would cost a host synchronisation)."""
        if isinstance(pooled_grad, torch.Tensor):
            pooled_grad = pooled_grad.detach()
        self._end_pending()
        self._core.end_iteration(pooled_grad)

    def all_reduce_(self, tensor):
        """Sums a contiguous float32 tensor over all trainers, in place; returns it. Every
        trainer calls it with the same size, in the same order (deterministic)."""
        self._end_pending()
        self._core.all_reduce_(tensor.detach() if isinstance(tensor, torch.Tensor) else tensor)
        return tensor

    def all_reduce_gradients(self, parameters):
        """Sums the ``.grad`` of ``parameters`` (an iterable of tensors, or one tensor, as
        torch.nn.utils.clip_grad_norm_ takes them) over all trainers in place, with one
        all-reduce (a missing gradient counts as zeros; tensors that do not require grad are
        skipped). Nothing to do with one trainer, but the parameters are checked all the same:
        dense, strided gradients of floating dtype at most 32 bits wide (the sum runs in float32:
        float64 is refused rather than rounded) on the trainer's device, not expanded (stride 0)
        (TypeError/ValueError otherwise)."""
        self._end_pending()
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        try:
            parameters = iter(parameters)
        except TypeError:
            raise TypeError("all_reduce_gradients: parameters must be a tensor or an iterable of "
                            f"tensors, got {type(parameters).__name__}") from None
        checked = []
        for index, p in enumerate(parameters):
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"all_reduce_gradients: parameter {index} is a "
                                f"{type(p).__name__}, not a tensor")
            if not p.requires_grad:
                continue
            for what, t in (("", p), (".grad", p.grad)):
                if t is None:
                    continue
                if t.layout != torch.strided:
                    raise TypeError(f"all_reduce_gradients: parameter {index}{what} is a "
                                    f"{t.layout} tensor (only dense gradients are summed)")
                if not t.is_floating_point():
                    raise TypeError(f"all_reduce_gradients: parameter {index}{what} is "
                                    f"{t.dtype}, not floating point")
                if t.element_size() > 4:
                    raise TypeError(f"all_reduce_gradients: parameter {index}{what} is "
                                    f"{t.dtype}: the sum runs in float32 and would round it "
                                    "(nothing was summed; use float32 parameters, or float16/"
                                    "bfloat16, which are summed in float32)")
                if t.device != self.device:
                    raise ValueError(f"all_reduce_gradients: parameter {index}{what} is on "
                                     f"{t.device}, not on the trainer's device {self.device}")
                if any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape)):
                    raise ValueError(f"all_reduce_gradients: parameter {index}{what} is "
                                     "expanded (a stride of 0): its elements share memory and "
                                     "cannot each hold a sum (nothing was summed; give it memory "
                                     "of its own, e.g. p.grad = p.grad.clone())")
            checked.append(p)
        parameters = checked
        if self.num_trainers == 1 or not parameters:
            return
        if not self._replicas_checked:
            self._replicas_checked = True
            self._check_same_replicas(parameters)
        grads = []
        for p in parameters:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        flat = torch.cat([g.reshape(-1) for g in grads]).to(torch.float32)
        self.all_reduce_(flat)
        offset = 0
        for g in grads:
            count = g.numel()
            g.copy_(flat[offset:offset + count].view_as(g))
            offset += count

    def _check_same_replicas(self, parameters):
        """Data parallelism sums the trainers' gradients into replicas that must start equal:
        replicas built from different random states (an unseeded model, or threads racing on
        torch's global generator) would train apart without a word, and only trainer 0's
        parameters would be saved. At the first all_reduce_gradients every trainer hashes its
        parameters' values; one all-reduce of the hash's bytes and their squares tells whether
        they all agree (the sum of squares is T times the square of the mean exactly when every
        trainer's byte is the same; both sums are exact in float32)."""
        digest = hashlib.blake2b(digest_size=8)
        for p in parameters:
            digest.update(p.detach().to("cpu").reshape(-1).view(torch.uint8).numpy().tobytes())
        chunks = torch.tensor(list(digest.digest()), dtype=torch.float32)
        sums = torch.cat([chunks, chunks * chunks]).to(self.device)
        self.all_reduce_(sums)
        sums = sums.cpu().double()  # the products below exceed float32's exact integers
        total, squares = sums[:8], sums[8:]
        if not torch.equal(total * total, squares * self.num_trainers):
            raise UsageError(
                f"all_reduce_gradients: trainer {self.id}: the trainers' dense parameters differ "
                "at the first all-reduce: every trainer's replica must start equal (build it from "
                "the same seed, not from threads racing on torch's global random generator, e.g. "
                "copy one model built before run_trainers, or load "
                "bagpipe.initial_dense_parameters); synchronous training would otherwise go on "
                "with replicas that differ")

    def flush(self):
        """After the last iteration: writes every cached row back to the servers."""
        self._end_pending()
        self._core.flush()
        self._batch = None
        self._end_node = None
        self._flushed = True

    def eval_batches(self):
        """After flush(): the held-out batches (config.eval_fraction or eval_data), each a
        Batch whose pooled embeddings come from the trained rows."""
        while True:
            self._register_stream()
            info = self._core.begin_eval_batch()
            if info is None:
                self._batch = None
                return
            yield self._make_batch(info, True)

    def complete(self, dense=None, predictions=None, labels=None, info=None):
        """Ends this trainer's part (flushes first if needed: before the last iteration that is
        flush's UsageError, and nothing changes). ``dense``: the dense model's parameters (a
        tensor or a list of tensors, e.g. ``list(model.parameters())``; trainer 0's go into
        params.bin and the fingerprint; an iterator such as ``model.parameters()`` too);
        ``predictions``/``labels``: held-out probabilities and
        labels in [0, 1] (summary.json's log loss and AUC; ValueError naming the first element
        outside, NaN included); ``info``: the loop's figures
        for summary.json (train_loss, iterations, samples, seconds, time_ms; checked here: a
        figure of the wrong type raises TypeError, a negative one ValueError). A figure not
        given is null there (iterations: the count the runtime kept), which ``bagpipe compare``
        shows as "-"."""
        def flat(values, what):
            if values is None:
                return None
            if isinstance(values, torch.Tensor):
                values = [values]
            elif isinstance(values, collections.abc.Iterator):
                # An iterator of tensors (model.parameters()), as all_reduce_gradients takes it.
                values = list(values)
            if isinstance(values, (list, tuple)) and values and isinstance(values[0], torch.Tensor):
                for index, v in enumerate(values):
                    if not isinstance(v, torch.Tensor):
                        raise TypeError(f"complete: {what}: item {index} is a "
                                        f"{type(v).__name__}, not a tensor")
                    if v.is_meta:
                        raise ValueError(f"complete: {what}: item {index} is a meta tensor "
                                         "(it holds no values)")
                    if v.is_complex():
                        raise TypeError(f"complete: {what}: item {index} is {v.dtype} (its "
                                        "imaginary part would be dropped)")
                parts = [v.detach().reshape(-1).to("cpu", torch.float32) for v in values]
                for index, (v, part) in enumerate(zip(values, parts)):
                    # float64 beyond float32's range would become infinite without a word.
                    if v.dtype != torch.float32 and \
                            bool((torch.isfinite(v.detach().reshape(-1).cpu()) &
                                  ~torch.isfinite(part)).any()):
                        raise ValueError(f"complete: {what}: item {index} ({v.dtype}) holds a "
                                         "value beyond float32's range")
                return torch.cat(parts).numpy()
            return np.ascontiguousarray(np.asarray(values, dtype=np.float32).reshape(-1))
        arrays = [flat(dense, "dense"), flat(predictions, "predictions"), flat(labels, "labels")]
        _check_unit_interval(arrays[1], "predictions", " (probabilities: pass torch.sigmoid of "
                             "the model's logits)")
        _check_unit_interval(arrays[2], "labels", "")
        info_text = _json_text(info, "complete: info")
        _check_info(info)
        self._end_pending()
        self._core.complete(*arrays, info_text)
        self._flushed = True

    def set_loop_state(self, save, restore):
        """Makes checkpoints hold the loop's own state (the dense model, its optimizer, the loop's
        counters: what the runtime does not hold). ``save()`` -> bytes runs on trainer 0 at each
        checkpoint's iteration boundary (inside begin_iteration or flush); ``restore(bytes)``
        runs on every trainer of a resumed job, inside this call. Call it before the first
        begin_iteration; required when the job resumes from a checkpoint with loop state."""
        self._core.set_loop_state(save, restore)

    def checkpoint_torch_state(self, *objects, get=None, set=None, metrics=None):
        """set_loop_state for objects with ``state_dict()``/``load_state_dict()`` (modules,
        optimizers), saved with torch.save; ``get()`` -> picklable extra state (e.g. the loop's
        counters) and ``set(extra)`` restore the rest. Every trainer holds the same dense
        replica, so trainer 0's is saved and every trainer restores it. ``metrics``: the
        MetricsWriter of the loop (trainer 0's; None elsewhere): the checkpoint records what
        its file starts with, so that a resumed job's ``metrics.start`` keeps the lines of the
        same run only."""
        if metrics is not None and not isinstance(metrics, MetricsWriter):
            raise TypeError(f"checkpoint_torch_state: metrics must be a bagpipe.MetricsWriter, "
                            f"got {type(metrics).__name__}")
        def save():
            # A diverged loop fails here rather than leave a checkpoint nothing can train on
            # from as the newest one.
            _check_finite_parameters(objects, "training diverged: ",
                                     "; the checkpoint is not written (the newest complete one "
                                     "is kept): lower the learning rate")
            buffer = io.BytesIO()
            torch.save({"objects": [o.state_dict() for o in objects],
                        "extra": get() if get is not None else None,
                        "metrics_first_lines": (metrics.first_lines
                                                if metrics is not None else None)}, buffer)
            return buffer.getvalue()

        def restore(data):
            state = torch.load(io.BytesIO(data), map_location=self.device)
            if len(state["objects"]) != len(objects):
                raise ValueError(f"the checkpoint holds {len(state['objects'])} objects' state, "
                                 f"this loop {len(objects)}")
            for o, o_state in zip(objects, state["objects"]):
                o.load_state_dict(o_state)
            _check_finite_parameters(objects, "the checkpoint's loop state is not finite (",
                                     "): it was saved after the training diverged; resume "
                                     "from an earlier checkpoint, with a lower learning rate")
            if metrics is not None:
                lines = state.get("metrics_first_lines")  # absent in older checkpoints
                if isinstance(lines, list) and all(isinstance(v, int) and 0 <= v < 2**32
                                                   for v in lines):
                    metrics._resumed_first_lines = lines
            if set is not None:
                set(state["extra"])
        self.set_loop_state(save, restore)

    @property
    def first_iteration(self):
        """The first iteration this job trains: 0, or the checkpoint's iteration when it resumed
        (batch.iteration counts on from there). Waits for the job's start."""
        return self._core.first_iteration()

    def stats(self):
        """The trainer's counters and phase times (seconds) so far, as a dict."""
        self._end_pending()
        return json.loads(self._core.stats_json())


def _check_unit_interval(values, what, hint):
    """ValueError naming the first element of ``values`` (a float32 array, or None) that is not
    in [0, 1] (NaN included): summary.json's log loss and AUC would be wrong."""
    if values is None:
        return
    bad = ~((values >= 0) & (values <= 1))
    if bad.any():
        index = int(np.argmax(bad))
        raise ValueError(f"complete: {what}: element {index} is {values[index]}, not in [0, 1]"
                         f"{hint} (nothing was done: the trainer can go on)")


def _check_finite_parameters(objects, prefix, suffix):
    """Raises FloatingPointError naming the first module parameter (of ``objects``) that holds a
    value that is not finite. Only parameters: buffers (e.g. -inf attention masks) and optimizer
    state may legitimately hold such values."""
    for k, o in enumerate(objects):
        if not isinstance(o, torch.nn.Module):
            continue
        for name, parameter in o.named_parameters():
            if parameter.is_floating_point() and not bool(torch.isfinite(parameter).all()):
                raise FloatingPointError(f"{prefix}parameter '{name}' of {type(o).__name__} "
                                         f"(object {k}) is not finite{suffix}")


# The figures of complete(info=...) that summary.json reads (model/run_report.cc), by JSON type:
# a count is an int in [0, 2**63) (int64_t there), a number a finite int or float (double).
_INFO_KINDS = {"iterations": "count", "samples": "count", "seconds": "non-negative number",
               "train_loss": "number", "time_ms": "dict"}


def _check_info(info):
    """TypeError/ValueError naming the figure of ``info`` the runtime could not read (it would
    fail in finish(), after the job ended)."""
    if not isinstance(info, dict):
        return  # None, or no dict: the runtime's UsageError says so
    for key, kind in _INFO_KINDS.items():
        if key not in info:
            continue
        value = info[key]
        what = f"complete: info[{key!r}]"
        if kind == "dict":
            if not isinstance(value, dict):
                raise TypeError(f"{what}: expected a dict, got {type(value).__name__}")
            continue
        types = int if kind == "count" else (int, float)
        if isinstance(value, bool) or not isinstance(value, types):
            raise TypeError(f"{what}: expected {'an int' if kind == 'count' else 'a number'}, "
                            f"got {type(value).__name__} {value!r:.80}")
        if kind == "count" and not 0 <= value < 2**63:
            raise ValueError(f"{what}: {value} is out of range [0, 2**63)")
        if kind != "count":  # finite: _json_text refused NaN and infinities
            try:
                number = float(value)
            except OverflowError:
                raise ValueError(f"{what}: an int of {value.bit_length()} bits is out of range "
                                 "(a float)") from None
            if kind == "non-negative number" and number < 0:
                raise ValueError(f"{what}: {value} is negative")


_live_jobs = weakref.WeakSet()


@atexit.register
def _close_jobs_at_exit():
    for job in list(_live_jobs):
        try:
            job.close()
        except Exception:  # the interpreter is exiting: nothing left to report to
            pass
    _core._shutdown()


def _forget_jobs_in_child():
    # A forked child has none of the jobs' threads (only the one that forked): closing its copy
    # of a job, or destroying its runtime objects, would join threads that do not exist. The
    # child keeps its copies alive for good (never collected) and closed to it, and forgets the
    # signal state that served them (its stop handlers act as the ones they replaced).
    for job in list(_live_jobs):
        job._forked_child = True
        job._stop_handlers = False
        job._watched = False
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(job))
    _live_jobs.clear()
    _StopHandlers._lock = threading.RLock()  # another thread may have held them
    _StopHandlers._jobs = weakref.WeakSet()
    _InterruptWatch._lock = threading.RLock()
    _InterruptWatch._current = None
    _core._forget_threads_in_child()
    # The child's signals are its own: they must not reach the parent's interrupt watch through
    # the inherited socket (a Ctrl-C to a process group with DataLoader workers would count as
    # several), and its copies of the socket must not keep the parent's watch from ending. The
    # fork may come from a thread of a job (a DataLoader's workers start when the job reads its
    # data) while the main thread is making the watch: its socket is listed from the start. The
    # forking thread is the child's main thread.
    sockets, _InterruptWatch._sockets = _InterruptWatch._sockets, []
    if sockets:
        try:
            current = signal.set_wakeup_fd(-1)
            for _, writer, previous in sockets:
                if current == writer.fileno():
                    current = -1 if previous is None else previous
            signal.set_wakeup_fd(current)
        except (ValueError, OSError):
            pass
        for reader, writer, _ in sockets:
            reader.close()
            writer.close()
    try:
        _StopHandlers._restore()
    except (ValueError, OSError):
        pass


# The signals that stop a job with checkpoints at an iteration boundary, as they stop
# `bagpipe train` (SIGUSR1: the one mpirun forwards to its ranks).
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


class _StopHandlers:
    """The process's SIGINT/SIGTERM/SIGUSR1 handlers while jobs with checkpoints are open: one
    handler for every such job, installed by the first (on the main thread) and replaced by the
    handlers it found when the last one closes, in whatever order the jobs close. A job closed
    on another thread (where signal.signal cannot be called) leaves the handler installed; with
    no job left it acts as the handler it replaced (default action, ignore, or the caller's
    function) and puts the replaced handlers back."""

    _lock = threading.RLock()
    _jobs = weakref.WeakSet()
    _previous = {}  # signal -> the handler found when the first job installed

    @staticmethod
    def _handler(signum, frame):
        with _StopHandlers._lock:
            if len(_StopHandlers._jobs) > 0:
                return  # the interrupt watch acts on it (signal.set_wakeup_fd)
            previous = _StopHandlers._previous.get(signum)
            _StopHandlers._restore()  # handlers run on the main thread
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:  # SIG_DFL, or a handler not set from Python
            os.kill(os.getpid(), signum)

    @classmethod
    def _restore(cls):
        for signum, previous in cls._previous.items():
            if signal.getsignal(signum) is cls._handler:
                signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        cls._previous = {}

    @classmethod
    def settle(cls):
        """On the main thread with no job left: puts back the handlers a job closed on another
        thread left installed (they act as the replaced ones meanwhile)."""
        with cls._lock:
            if (len(cls._jobs) == 0 and cls._previous and
                    threading.current_thread() is threading.main_thread()):
                cls._restore()

    @classmethod
    def install(cls, job):
        """Main thread only."""
        with cls._lock:
            if not cls._previous:
                for signum in _STOP_SIGNALS:
                    cls._previous[signum] = signal.signal(signum, cls._handler)
            cls._jobs.add(job)

    @classmethod
    def uninstall(cls, job):
        with cls._lock:
            cls._jobs.discard(job)
            cls.settle()


class _InterruptWatch:
    """Acts on a SIGINT (or a SIGTERM Python handles) while a call blocks in the runtime: Python's
    signal handler only sets a flag that the blocked main thread would not see.
    signal.set_wakeup_fd makes the handler also write the signal number to a socket this thread
    reads; it then calls ``job._on_signal(signum)`` for every live job it watches (the Job
    aborts, or stops at an iteration boundary when checkpoints are configured). Python's own
    handler then runs on the main thread as usual.

    One watch serves every job of the process (set_wakeup_fd holds one descriptor), so jobs may
    close in any order: the watch starts with the first job created on the main thread and ends
    when the last one closes there (set_wakeup_fd works from the main thread only; a job closed
    on another thread leaves the watch running, idle, for the next job). The watch holds the
    jobs weakly: its thread must not keep a Job alive (a Job dropped without close() is
    collected, and its __del__ ends the job)."""

    # Guards _current and every watch's _jobs. Reentrant: a Job collected while it is held (its
    # __del__ closes it) unwatches itself on the same thread.
    _lock = threading.RLock()
    _current = None  # the running watch, or None
    # [reader, writer, the previous wakeup descriptor] of the watch, from the moment its socket
    # exists (what a forked child closes: _forget_jobs_in_child).
    _sockets = []

    # A byte no signal is numbered (signals are below NSIG): written when a job joins a running
    # watch, it separates the signals delivered before the job from those after (_run).
    _JOINED = 0xFF

    def __init__(self):
        self._jobs = weakref.WeakSet()
        # Each job's place among the _JOINED markers: it hears the signals read after its marker
        # (a watch left running by a job closed on another thread may hold a signal from before
        # the next job, e.g. the Ctrl-C the replaced handler acted on, not yet read).
        self._joined = weakref.WeakKeyDictionary()
        self._markers_sent = 0
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        listed = [self._reader, self._writer, None]
        _InterruptWatch._sockets.append(listed)
        try:
            self._previous = signal.set_wakeup_fd(self._writer.fileno(),
                                                  warn_on_full_buffer=False)
            listed[2] = self._previous
        except (ValueError, OSError):
            _InterruptWatch._sockets.remove(listed)
            self._reader.close()
            self._writer.close()
            raise
        self._thread = threading.Thread(target=self._run, name="bagpipe-interrupt-watch",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def watch(cls, job):
        """Makes Ctrl-C act on ``job``; False when it cannot (not on the main thread: Ctrl-C is
        left to Python)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        with cls._lock:
            if cls._current is None:
                try:
                    cls._current = cls()
                except (ValueError, OSError):  # no signals here (e.g. a subinterpreter)
                    return False
            elif len(cls._current._jobs) == 0:
                # Idle (its last job closed on another thread): signals it has not read yet are
                # not this job's.
                watch = cls._current
                try:
                    watch._writer.send(bytes([cls._JOINED]))
                    watch._markers_sent += 1
                except OSError:  # a full socket: the job hears what is queued too
                    pass
            watch = cls._current
            watch._joined[job] = watch._markers_sent
            watch._jobs.add(job)
        return True

    @classmethod
    def unwatch(cls, job):
        """Stops acting on ``job``; ends the watch when no job is left and this is the main
        thread, and the wakeup descriptor is still the watch's (another one set after it, e.g.
        an asyncio loop's, may restore the watch's later: it then stays open)."""
        with cls._lock:
            watch = cls._current
            if watch is None:
                return
            watch._jobs.discard(job)
            if len(watch._jobs) > 0 or threading.current_thread() is not threading.main_thread():
                return
            try:
                current = signal.set_wakeup_fd(watch._previous)
            except (ValueError, OSError):  # the previous descriptor was closed meanwhile
                current = signal.set_wakeup_fd(-1)
            if current != watch._writer.fileno():
                signal.set_wakeup_fd(current)
                return
            cls._current = None
            cls._sockets = [e for e in cls._sockets if e[1] is not watch._writer]
        try:  # the end, even if a process forked without the hook above holds the writer too
            watch._writer.send(b"\0")
        except OSError:
            pass
        watch._writer.close()
        if threading.current_thread() is not watch._thread:
            watch._thread.join()
        watch._reader.close()

    def _run(self):
        markers_read = 0
        while True:
            try:
                received = self._reader.recv(64)
            except OSError:
                return
            if not received:
                return
            end = received.find(b"\0")  # unwatch's end (no signal is numbered 0)
            if end >= 0:
                received = received[:end]
            signals = received.replace(bytes([self._JOINED]), b"")
            if self._previous >= 0 and signals:
                try:
                    os.write(self._previous, signals)  # the previous listener gets them too
                except OSError:
                    pass
            with self._lock:
                jobs = [(job, self._joined.get(job, 0)) for job in self._jobs]
            # One byte per signal delivered, in order: two signals read in one go are two (the
            # second one aborts a job the first one stops). A job hears those after its marker.
            for byte in received:
                if byte == self._JOINED:
                    markers_read += 1
                    continue
                if byte not in _STOP_SIGNALS:
                    continue
                for job, joined in jobs:
                    if joined > markers_read:
                        continue
                    try:
                        job._on_signal(byte)
                    except Exception:  # e.g. closed meanwhile: the other jobs still hear it
                        pass
            del jobs
            if end >= 0:
                return


os.register_at_fork(after_in_child=_forget_jobs_in_child)


class _OneShot:
    """Data that is an iterator (a generator): the runtime calls iter() on its data at each pass,
    and a spent iterator would look empty ("yields no samples"). The second pass raises an error
    that says why instead. A subclass per iterator type keeps the data's description ("python
    iterable (generator)")."""

    def __init__(self, iterator):
        self._iterator = iterator

    def __iter__(self):
        iterator, self._iterator = self._iterator, None
        if iterator is None:
            raise ConfigError(f"Job: data is a one-shot iterator ({type(self).__name__}) and "
                              "config.iterations asks for more than one pass over it: it cannot "
                              "be read twice (pass a re-iterable, such as a list or an object "
                              "whose __iter__ starts a new pass)")
        return iterator


_one_shot_types = {}  # iterator type name -> its _OneShot subclass


def _one_shot(iterator, config):
    """``iterator`` as Job's data: ConfigError at once when the config reads the data more
    than once (epochs > 1), else wrapped in a _OneShot."""
    if config.iterations == 0 and config.epochs > 1:
        raise ConfigError(f"Job: data is a one-shot iterator ({type(iterator).__name__}) and "
                          f"config.epochs is {config.epochs}: it cannot be read twice (pass a "
                          "re-iterable, such as a list or an object whose __iter__ starts a new "
                          "pass)")
    name = type(iterator).__name__
    if name not in _one_shot_types:
        _one_shot_types[name] = type(name, (_OneShot,), {})
    return _one_shot_types[name](iterator)


class Job:
    """A Bagpipe job: starts the oracle and the embedding servers (threads of this process) and
    hands out the trainers this process hosts (``job.trainers``) for the caller's threads — or,
    launched by ``mpirun``, plays this rank's role (rank 0 the oracle, ranks 1..S the servers,
    the others one trainer each; every rank runs the same script).

    ``config``: a Config (or parse_train_args' first result). Data: ``config.data`` names a
    source (synthetic:..., criteo:PATH, csv:PATH with config.schema, bin:PATH), or ``data`` is an
    iterable of batches read ahead by the oracle on its own thread — each item a dict with
    ``dense`` [n, num_dense], ``labels`` [n] and per-table ``ids`` (a list of 1-D id arrays)
    with optional per-table ``offsets`` (n bag starts as nn.EmbeddingBag takes them, or n + 1
    CSR offsets; none: one id per sample) — described by ``schema`` (a Schema);
    ``eval_data``: held-out batches in the same form. The samples of the items are cut into
    global batches of ``config.batch_size``. Each pass calls iter(data) anew: an iterator (a
    generator) is read once, and a second pass (epochs > 1 up front; iterations beyond its end
    when it gets there) raises ConfigError.

    Checkpoints: ``config.checkpoint_dir``/``checkpoint_every``/``keep_checkpoints``/``resume``
    as ``bagpipe train``'s flags; each trainer registers the loop's state
    (Trainer.checkpoint_torch_state or set_loop_state) before its first iteration;
    ``checkpoint_identity``: a dict of the loop's own options a resumed job must match (e.g. the
    dense model's sizes), or a callable that takes the data's Schema and returns it (for options
    whose defaults depend on the data: record the value they resolve to, so that a job that
    gives the default and one that leaves it match). ``checkpoint_defaults``: for options that
    older checkpoints recorded as given, "" for the default, and this loop records resolved: a
    dict of the values those defaults take here (or a callable of the Schema returning it); a
    checkpoint's "" is compared as that value. ``request_stop()`` — and, with checkpoints
    configured, the first Ctrl-C, SIGTERM or SIGUSR1 (what mpirun forwards to every rank)
    between the job's creation and its close, on the main thread's process (the job holds those
    handlers meanwhile) — stops the job at an iteration boundary with a checkpoint;
    ``finish()`` then raises Stopped saying where to resume. A second signal aborts. Without
    checkpoints, Ctrl-C aborts the job (KeyboardInterrupt) unless the caller installed a SIGINT
    handler of its own: that handler's call then.

    Use it as a context manager: leaving the block with an exception aborts the job (every
    thread and rank stops) and ``close()`` joins its threads."""

    def __init__(self, config, data=None, schema=None, eval_data=None, checkpoint_identity=None,
                 checkpoint_defaults=None):
        if not isinstance(config, _core.Config):
            raise TypeError(f"Job: config must be a bagpipe.Config, got {type(config).__name__}")
        if schema is not None and not isinstance(schema, Schema):
            raise TypeError(f"Job: schema must be a bagpipe.Schema, got {type(schema).__name__}")
        for name, value in (("data", data), ("eval_data", eval_data)):
            if value is not None and (isinstance(value, (str, bytes)) or
                                      not isinstance(value, collections.abc.Iterable)):
                raise TypeError(f"Job: {name} must be an iterable of batches (dicts), got "
                                f"{type(value).__name__}" +
                                (" (a data source's name goes in config.data)"
                                 if isinstance(value, str) else ""))
        normalize = None
        if data is not None:
            if schema is None:
                raise ConfigError("Job: data given as an iterable needs a schema "
                                  "(bagpipe.Schema(table_rows=[...], num_dense=...))")
            normalize = _data.Normalizer(schema.num_tables, schema.num_dense)
            if isinstance(data, collections.abc.Iterator):
                data = _one_shot(data, config)
        self._core = _core.Job(
            config, data, eval_data, normalize, schema,
            _identity_text(checkpoint_identity, "Job: checkpoint_identity"),
            _identity_text(checkpoint_defaults, "Job: checkpoint_defaults"))
        self.schema = self._core.schema
        self.trainers = [Trainer(t, self.schema.num_tables, self.schema.num_dense, self.config.dim)
                         for t in self._core.trainers()]
        self._finished = False
        self._ran = False
        self._signals = 0
        self._signal_lock = threading.Lock()
        _StopHandlers.settle()
        self._watched = _InterruptWatch.watch(self)
        self._stop_handlers = self._install_stop_handlers()
        _live_jobs.add(self)

    config = property(lambda self: Config._of(self._core.config),
                      doc="The job's options (a copy: changing it changes nothing).")
    rank = property(lambda self: self._core.rank, doc="This process's rank (0 when embedded).")
    world_size = property(lambda self: self._core.world_size,
                          doc="Ranks of the job: 1 oracle + servers + trainers.")
    num_trainers = property(lambda self: self._core.num_trainers,
                            doc="Trainers of the whole job.")
    servers = property(lambda self: self._core.servers)
    cache_rows = property(lambda self: self._core.cache_rows,
                          doc="Rows of each trainer's cache (after the default).")
    mpirun = property(lambda self: self._core.mpirun, doc="Launched by mpirun.")
    description = property(lambda self: self._core.description, doc="The data source.")
    aborted = property(lambda self: self._core.aborted,
                       doc="Why the job was aborted (the root cause's message), or None.")

    def __repr__(self):
        where = f"rank {self.rank} of {self.world_size} (mpirun)" if self.mpirun else "embedded"
        return (f"bagpipe.Job({where}, {self.num_trainers} trainer(s), {self.servers} "
                f"server(s), {len(self.trainers)} local)")

    def run_trainers(self, fn, *args, **kwargs):
        """Runs ``fn(trainer, *args, **kwargs)`` for every local trainer, one thread each (the
        calling thread takes the first, so Ctrl-C lands in a loop), and returns their results.
        A trainer that raises aborts the job — the others' blocked calls raise JobError — and
        its exception (the root cause) is raised here once all have stopped."""
        if self._finished or self._core.closed:
            raise UsageError("run_trainers: the job is "
                             + ("closed" if self._core.closed else "finished"))
        if self._ran:
            raise UsageError("run_trainers: called twice (a job trains once; each trainer's "
                             "loop runs to its end in the first call)")
        self._ran = True
        results = [None] * len(self.trainers)
        errors = []

        def body(index):
            trainer = self.trainers[index]
            try:
                results[index] = fn(trainer, *args, **kwargs)
            except BaseException as error:  # KeyboardInterrupt included: the job must stop
                errors.append(error)
                if self.mpirun:
                    # The abort ends this process at once (MPI_Abort): its traceback now or never.
                    traceback.print_exception(type(error), error, error.__traceback__,
                                              file=sys.stderr)
                    sys.stderr.flush()
                self.abort(f"trainer {trainer.id} raised {_describe(error)}{_where(error)}")
                return
            # A loop that returns before its training ended leaves the other trainers waiting for
            # its part of the next iteration (its exchanges, all-reduces): the job ends now. The
            # flush finish() would do tells (it is refused while an iteration is open or left).
            if not trainer._flushed and self._core.aborted is None:
                try:
                    trainer.flush()
                except UsageError as refused:
                    error = UsageError(
                        f"run_trainers: trainer {trainer.id}'s function returned before its "
                        f"training ended ({refused}): each trainer's loop runs every iteration "
                        "(`for batch in trainer` until it ends), so that every trainer takes part "
                        "in every iteration")
                    errors.append(error)
                    self.abort(str(error))

        threads = [threading.Thread(target=body, args=(i,), name=f"bagpipe-trainer-{i}")
                   for i in range(1, len(self.trainers))]
        for thread in threads:
            thread.start()
        try:
            if self.trainers:
                body(0)
        finally:
            for thread in threads:
                while thread.is_alive():
                    try:
                        thread.join()
                    except KeyboardInterrupt as error:
                        errors.append(error)
                        self.abort("interrupted (SIGINT)")
        if errors:
            # The root cause first: the error that is not the echo of the job's abort.
            errors.sort(key=lambda e: isinstance(e, JobError))
            raise errors[0]
        return results

    def abort(self, message="aborted"):
        """Ends the job everywhere: every blocked or later call raises JobError(message). An
        empty message (or None) says "aborted"; a NUL is spelled \\0 and what UTF-8 cannot
        encode is escaped, so the message arrives whole. After finish() it does nothing (the
        job is over; ``aborted`` keeps what finish said)."""
        text = "" if message is None else _message_text(message)
        self._core.abort(text or "aborted")

    def request_stop(self, signum=signal.SIGINT):
        """Stops the job at an iteration boundary, as SIGINT/SIGTERM/SIGUSR1 stop ``bagpipe train``:
        every rank agrees on the iteration (at most lookahead + plan queue + 2 after the
        request), a checkpoint is written when config.checkpoint_dir is set, every trainer's
        begin_iteration then returns None, and finish() raises Stopped. Thread-safe; from any
        thread or a signal handler. ``signum``: the signal reported (an int in [1, NSIG))."""
        if isinstance(signum, (bool, np.bool_)):
            raise TypeError("request_stop: signum must be a signal number, got bool")
        try:
            signum = operator.index(signum)
        except TypeError:
            raise TypeError(f"request_stop: signum must be a signal number, got "
                            f"{type(signum).__name__}") from None
        if not 0 < signum < signal.NSIG:
            raise ValueError(f"request_stop: signum {signum} is no signal number (1 to "
                             f"{signal.NSIG - 1})")
        self._core.request_stop(signum)

    @property
    def checkpoints(self):
        """True when the job writes checkpoints (config.checkpoint_dir or config.resume)."""
        return bool(self.config.checkpoint_dir or self.config.resume)

    def _on_signal(self, signum):
        if not self.checkpoints and signum != signal.SIGINT:
            return  # a SIGTERM handler of the caller's: not ours to act on
        handler = signal.getsignal(signum)
        if handler is _StopHandlers._handler:  # another job's, standing in for the caller's
            handler = _StopHandlers._previous.get(signum)
        if not self.checkpoints and handler is not signal.default_int_handler:
            return  # the caller handles SIGINT itself (e.g. to stop after the epoch): its call
        with self._signal_lock:
            self._signals += 1
            graceful = self.checkpoints and self._signals == 1
        if graceful:
            self.request_stop(signum)
        else:
            self.abort(f"interrupted ({signal.Signals(signum).name})")

    def _install_stop_handlers(self):
        # With checkpoints, the first SIGINT/SIGTERM/SIGUSR1 stops at an iteration boundary
        # instead of raising KeyboardInterrupt in the loop or ending the process (the watch
        # thread requests the stop); a second one aborts the job. From the job's start to its
        # close, on every rank: under mpirun, rank 0 and the servers host no trainer, and the
        # SIGUSR1 mpirun forwards reaches them in finish(). Main thread only (where Python runs
        # handlers); close() puts the caller's handlers back.
        if not self.checkpoints or not self._watched:
            return False
        _StopHandlers.install(self)
        return True

    def finish(self, out=None, summary_json=None, dump_params=None, model=None):
        """Waits for the job to end (after the trainers' threads are done). Rank 0 gathers every
        parameter into the fingerprint — and DIR/params.bin with ``dump_params`` — and returns
        the summary (the same summary.json as ``bagpipe train``; written with ``summary_json``,
        or into ``out``/summary.json); other ranks return None. ``model``: a dict describing the
        dense model for summary.json and the params.bin header (e.g. model/bottom/top). Paths
        that cannot be written raise TypeError/ValueError before the job ends (retry with
        others), and an ``out`` another job holds (its RunDirectoryLock, or a ``bagpipe train
        --out`` running there) ConfigError."""
        model = _json_text(model, "finish: model")
        default_summary = summary_json is None
        summary_json = _path_text(summary_json, "finish: summary_json")
        dump_params = _path_text(dump_params, "finish: dump_params")
        if out is not None:
            out = _path_text(out, "finish: out")
            if not out:
                raise ValueError("finish: out: the path is empty")
            _make_directory(out, "finish: out")
            if default_summary:
                summary_json = os.path.join(out, "summary.json")
        lock = None
        if self.rank == 0:  # the rank that writes them
            if summary_json:
                _check_output_file(summary_json, "finish: summary_json")
            if dump_params:
                _make_directory(dump_params, "finish: dump_params")
            # Another job's run directory is not written into (as bagpipe train's --out): held
            # while the files are written, unless this process holds it already (the caller's
            # RunDirectoryLock, as examples/dlrm_pytorch.py takes for the whole run).
            if out is not None and not RunDirectoryLock.held_here(out):
                lock = RunDirectoryLock(out)
        try:
            text = self._core.finish(summary_json, dump_params, model)
        finally:
            if lock is not None:
                lock.release()
        self._finished = True
        result = None if text is None else json.loads(text)
        if result is not None and "stopped" in result:
            stopped = result["stopped"]
            raise Stopped(stopped["message"], stopped["iteration"], stopped["checkpoint"],
                          stopped["resume"], stopped["signal"])
        if result is not None and "params_error" in result:
            # The parameter dump failed (a full disk): the results are not lost with it.
            error = JobError(result["params_error"])
            error.summary = result
            raise error
        return result

    def close(self):
        """Aborts the job unless it finished, waits for calls in flight and joins its threads.
        Idempotent."""
        if getattr(self, "_forked_child", False):
            return  # a forked child's copy: its runtime threads are the parent's
        try:
            if getattr(self, "_stop_handlers", False):
                self._stop_handlers = False
                _StopHandlers.uninstall(self)
            if getattr(self, "_watched", False):
                self._watched = False
                _InterruptWatch.unwatch(self)
        finally:  # the runtime closes whatever happened to the watch
            core = getattr(self, "_core", None)
            if core is not None:
                core.close()
            _live_jobs.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if error is not None and not self._finished:
            self.abort(_describe(error))
        self.close()
        return False

    def __del__(self):
        # The last reference may go on a thread of the job's own (the oracle's, reading an
        # iterable), which close() would join: close on a thread of its own then (not a daemon:
        # the interpreter waits for it before it exits).
        if isinstance(threading.current_thread(), threading._DummyThread):
            threading.Thread(target=self._close_quietly, name="bagpipe-close", daemon=False).start()
        else:
            self._close_quietly()

    def _close_quietly(self):
        try:
            self.close()
        except Exception:
            pass
