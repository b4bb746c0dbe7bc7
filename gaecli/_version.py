"""The package version, kept apart so that `gae --version` imports nothing heavy."""

__version__ = "0.1.0"
