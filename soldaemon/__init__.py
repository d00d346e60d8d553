"""soldaemon: a local, resident code-completion daemon."""

__version__ = "0.1.0"
