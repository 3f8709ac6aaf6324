"""The program that runs inside a sandbox and executes model-written code.

The host binds this package's directory into the sandbox and starts `__main__.py` there as a
script (inside bubblewrap), which loads the directory as the package `pyvision_sandbox_runtime`:
`pyvision_jax` itself is not visible inside, so these modules import each other relatively
only. The host imports `protocol` alone, for the frame format both sides share. A runtime of
its own depends only on the standard library until its limits are set and its privileges
dropped, then imports numpy, PIL and matplotlib for the code it runs. A pool's `template`
imports them before it forks runtimes (it runs no model code); each fork builds its namespaces
(`namespaces`) and sets its limits before the request loop of `main` starts.

Builtins: every module whose functions run after user code replaces its `__builtins__` with
a private copy after its imports and before its first definition (a function keeps the
builtins of its module at the time it is defined), so user code that replaces `builtins.print`, `len`,
`__import__`, ... breaks only its own later calls. For the same reason the `os` and `json`
functions they use are bound when a module is imported.

Channel: two inherited pipes carry frames `MAGIC | u32 json length | u64 blob length | json |
blob` (host -> runtime requests, runtime -> host replies). They are moved to high descriptor
numbers so that ordinary file handling in user code cannot clobber them; user code that does
break them only ends its own runtime, which the host reports. Every request carries a sequence
number that the reply repeats.

Output: `print` goes to an in-process capture capped at `max_stdout_bytes` (the rest is only
counted); descriptors 1 and 2 are a pipe drained into the same capture, so C-level writes and
`os.write(1, ...)` are captured and capped too. Figures reach the host through a matplotlib
backend whose `show` renders them; `display(...)` does the same for PIL images and arrays.
"""
