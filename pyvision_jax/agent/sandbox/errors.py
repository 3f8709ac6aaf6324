"""Errors of the sandbox itself, as opposed to errors of the code it runs (which are results)."""


class SandboxError(RuntimeError):
    """The sandbox could not do what was asked (not an error of the code it ran)."""


class SandboxUnavailableError(SandboxError):
    """bubblewrap is missing and the configuration does not allow unisolated runtimes."""


class SandboxStartError(SandboxError):
    """A runtime did not start."""
