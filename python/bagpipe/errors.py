"""The exceptions bagpipe raises (besides TypeError/ValueError for a tensor of the wrong dtype,
shape, device or layout, and KeyboardInterrupt when Ctrl-C stops a loop)."""


class Error(RuntimeError):
    """Base class of bagpipe's own errors."""


class ConfigError(Error, ValueError):
    """The options are out of range or contradict each other, or the data cannot be opened.
    The message names the options as `bagpipe train` spells them (--cache-rows is
    Config.cache_rows)."""


class UsageError(Error):
    """A call out of order (end_iteration before begin_iteration, begin_iteration twice, flush
    inside an iteration, a trainer driven from two threads at once, a call after finish or
    close). Nothing changed: the trainer can go on."""


class JobError(Error):
    """The job failed: on another thread or rank (a peer died or hung, bad data, an exception in
    another trainer's loop), or it was aborted (abort(), Ctrl-C). The message is the root cause,
    named by the rank where it happened. Every trainer's next call raises it too. Raised by
    Job.finish when only the parameter dump failed (a full disk), it carries the run's summary
    as ``summary`` (also written to summary_json, with "params_error")."""

    summary = None


class Stopped(Error):
    """The job stopped early at an iteration boundary (Job.request_stop, or Ctrl-C/SIGTERM in
    Job.run_trainers with checkpoints configured) and wrote a checkpoint when a directory was
    set; raised by Job.finish on rank 0 instead of returning a summary. ``iteration``: where it
    stopped; ``checkpoint``: the checkpoint to resume from ("" when none); ``resume``: the
    directory to pass as Config.resume (``--resume``); ``signal``: the signal number reported."""

    def __init__(self, message, iteration=-1, checkpoint="", resume="", signal=0):
        super().__init__(message)
        self.iteration = iteration
        self.checkpoint = checkpoint
        self.resume = resume
        self.signal = signal
