"""The installed jax's version, for the few checks whose expected figure is the compiler's
(standard library only: `tests/conftest.py` reads it before jax is imported)."""
from importlib import metadata


def jaxlib_before(major: int, minor: int) -> bool:
    """Whether the installed jaxlib is older than `major.minor` (True when it cannot be read:
    the pinned environment's)."""
    try:
        parts = metadata.version("jaxlib").split(".")[:2]
        return (int(parts[0]), int(parts[1])) < (major, minor)
    except (metadata.PackageNotFoundError, ValueError, IndexError):
        return True
