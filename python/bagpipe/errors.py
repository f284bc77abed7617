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
    named by the rank where it happened. Every trainer's next call raises it too."""
