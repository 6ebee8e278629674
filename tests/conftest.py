"""Test-wide setup: 8 fake CPU devices, the CPU platform and a compilation cache, set before
jax is imported; the files in a random order that keeps the long ones early; every test and
test module checked for leaving the process as it found it (`tests/testlib/leak_check.py`).

The sharding tests need 8 host devices (mesh data=2, fsdp=2, tensor=2); single-device
computations simply run on device 0, so every test can share this setting.
"""
import atexit
import os
import secrets
import shutil
import tempfile

from tests.testlib import schedule  # noqa: E402  (the standard library only)
from tests.testlib.xla_flags import xla_flags  # noqa: E402  (the standard library only)

# 8 host devices and fast compilation (tests/testlib/xla_flags.py says why and what it saves).
os.environ.setdefault("XLA_FLAGS", xla_flags(8))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One persistent XLA compilation cache for the run, which the training subprocesses of the CLI
# tests inherit: a SIGKILLed run and its resume compile the step the uninterrupted run already
# compiled, and many tests compile the same tiny models. A compiled executable computes what a
# fresh compile does, so no result depends on it; it only saves time. Removed at exit.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="xlm_jax_tests_xla_cache_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, True)
# Every compile is cached, however short: the small ones add up (saving a sharded state compiles
# one `slice` per device and array shape, ~20 ms each, dozens per process; measured on the
# trainer tests: 5% less CPU than caching only compiles over 0.1 s).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import pytest  # noqa: E402  (after the environment above)

# The environment above is the suite's own, set once at start: it is there before the first
# test, so the leak check (which compares each test's end with its start) takes it as given.
pytest_plugins = ["tests.testlib.leak_check"]

ORDER_ENV, SEED_ENV = "XLM_JAX_TEST_FILE_ORDER", "XLM_JAX_TEST_ORDER_SEED"


def pytest_addoption(parser):
    group = parser.getgroup("xlm_jax file order")
    group.addoption("--file-order", choices=schedule.ORDERS,
                    default=os.environ.get(ORDER_ENV, "weighted"),
                    help="weighted: random, long files early (default); shuffle: uniformly "
                         f"random; longest: longest first; given: as collected, the command line's "
                         f"order (env {ORDER_ENV})")
    group.addoption("--file-order-seed", type=int,
                    default=int(os.environ[SEED_ENV]) if os.environ.get(SEED_ENV) else None,
                    help=f"the seed of a random file order, to run one again (env {SEED_ENV}; "
                         "default: a new one, printed at the start and the end)")
    group.addoption("--file-seconds", metavar="PATH", default=None,
                    help="write the seconds each test file took to PATH (JSON, the format of "
                         "tests/file_seconds.json)")


def _file_order(config) -> tuple[str, int]:
    """(order, seed): the seed drawn once by the controller and handed to xdist's workers
    (`pytest_configure_node`), which must collect the same order."""
    worker = getattr(config, "workerinput", None)
    if worker is not None and "file_order_seed" in worker:
        return config.getoption("file_order"), worker["file_order_seed"]
    if config.getoption("file_order_seed") is None:
        config.option.file_order_seed = secrets.randbelow(1_000_000)
    return config.getoption("file_order"), config.getoption("file_order_seed")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["file_order_seed"] = _file_order(node.config)[1]


def _order_line(config) -> str:
    how, seed = _file_order(config)
    if how in ("longest", "given"):
        return f"file order: {how} (not random)"
    return (f"file order: {how}, seed {seed} (the same order again: --file-order={how} "
            f"--file-order-seed={seed})")


def pytest_configure(config):
    """The suite's `python -m xlm_jax...` commands fork from a process that has imported
    TensorFlow, jax and seqio once (`tests/testlib/fork_server.py`; TEST_FORK_SERVER=0: no)."""
    from tests.testlib import fork_server

    fork_server.install()


def pytest_unconfigure(config):
    from tests.testlib import fork_server

    forked, fallback = fork_server.uninstall()
    log = os.environ.get("TEST_FORK_SERVER_LOG")
    if log and (forked or fallback):
        with open(log, "a") as f:
            f.write(f"{os.getpid()} forked {forked} started {fallback}\n")


def pytest_report_header(config):
    return _order_line(config)


# Seconds per test file (setup, call and teardown of its tests), summed from the reports the
# run's workers send: the end of every run lists the slowest files, and `--file-seconds=PATH`
# writes them all as tests/file_seconds.json's format (to refresh the schedule's table).
_FILE_SECONDS: dict = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, config):
    if _FILE_SECONDS and not hasattr(config, "workerinput"):
        total = sum(_FILE_SECONDS.values())
        terminalreporter.write_sep("=", f"slowest test files ({total:.0f} s of tests in all)")
        slowest = sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:15]
        for path, seconds in slowest:
            terminalreporter.write_line(f"{seconds:8.1f}s {path}")
        out = config.getoption("file_seconds")
        if out:
            schedule.write_table(_FILE_SECONDS, out)
    terminalreporter.write_line(_order_line(config))


def pytest_collection_modifyitems(config, items):
    """The files in a random order in which the long ones come early (`schedule.order`; the
    module docstring of tests/testlib/schedule.py says why both), each file's tests in their
    own order. Tests marked `slow` (minutes each: base-size shapes, a whole demo, a wheel
    install) are skipped unless XLM_JAX_SLOW_TESTS is set (`make test-slow` sets it and
    selects them)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = {id(item): os.path.relpath(str(item.path), root) for item in items}
    how, seed = _file_order(config)
    order = schedule.order(list(dict.fromkeys(files.values())), schedule.file_seconds(), how,
                           seed)
    rank = {f: n for n, f in enumerate(order)}
    items.sort(key=lambda item: rank[files[id(item)]])
    if os.environ.get("XLM_JAX_SLOW_TESTS"):
        return
    skip = pytest.mark.skip(reason="slow; set XLM_JAX_SLOW_TESTS=1 (make test-slow)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gin_isolated():
    """gin's state put back after the test (`tests/testlib/gin_state.py`): for tests that
    parse gin files, register configurables or call one in this process."""
    from tests.testlib import gin_state

    with gin_state.isolated():
        yield


@pytest.fixture
def seqio_isolated():
    """seqio's Task and Mixture registries and the prepared-data switch put back after the
    test, less what a tasks module registered when first imported (it stays imported): for
    tests that register tasks, or register them again over other data
    (`tests/testlib/process_state.py`, `restored`)."""
    from tests.testlib import process_state

    with process_state.restored("seqio", "prepared data"):
        yield


@pytest.fixture(scope="session")
def train_xlmr_spm():
    """`train(input_path, model_prefix, vocab_size, **extra) -> model path`: a small
    SentencePiece model with the XLM-R special layout (unk=0, bos=1, eos=2, no pad) trained on
    a test's text file; `extra` adds trainer options."""
    import sentencepiece as spm

    from xlm_jax.data.vocab import SPM_TRAINER_IDS

    def train(input_path, model_prefix, vocab_size: int, **extra) -> str:
        spm.SentencePieceTrainer.train(
            input=str(input_path), model_prefix=str(model_prefix), vocab_size=vocab_size,
            hard_vocab_limit=False, minloglevel=2, **SPM_TRAINER_IDS, **extra)
        return f"{model_prefix}.model"
    return train
