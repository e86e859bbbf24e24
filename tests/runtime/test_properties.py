"""Property tests with the library's own strategies (``tlckpt.testing.strategies``).

* Any valid optimizer state the codec writes loads into a live torch optimizer (exactly the
  entries' bits, ``step`` included) and the runtime saves it back to the very same bytes;
  a step the optimizer's float32 ``step`` cannot hold is refused and changes nothing.
* The same for float32 model state.
* Random splices of a real file either are rejected with nothing changed, or load exactly
  what the codec reads.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tlckpt.codec import (
    AdamEntry,
    AdamKind,
    CheckpointError,
    EntryError,
    MomentDtype,
    ParameterSchema,
    read_adam,
    write_adam,
    write_float32_state,
)
from tlckpt.runtime import load_module_state, load_optimizer, save_module_state, save_optimizer
from tlckpt.testing.bitwise import optimizer_unchanged, same, snapshot_optimizer
from tlckpt.testing.strategies import AdamState, adam_states, byte_splices, float32_states

_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _live(schema: ParameterSchema, dtype: torch.dtype) -> list[torch.Tensor]:
    """Parameters with ``schema``'s layout: a tied slot repeats its representative."""
    out: list[torch.Tensor] = []
    for i, shape in enumerate(schema.shapes):
        r = schema.representative(i)
        if r is not None and r != i:
            out.append(out[r])
        else:
            out.append(torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=r == i))
    return out


def _optimizer(state, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    c = state.config
    cls = torch.optim.AdamW if c.kind is AdamKind.ADAMW else torch.optim.Adam
    unique = list({id(p): p for p in params}.values())
    return cls(
        unique, lr=1e-3, betas=(c.beta1, c.beta2), eps=c.epsilon, weight_decay=c.weight_decay
    )


@st.composite
def _states(draw: st.DrawFn):
    """Valid states; mostly with steps a float32 ``step`` tensor holds (the strategy's own
    steps span all of u64, which Adam's float32 counter mostly cannot hold)."""
    state = draw(adam_states())
    if draw(st.integers(0, 3)):
        small = st.one_of(st.integers(1, 2**24), st.sampled_from([2**40, 2**63]))
        entries = {i: AdamEntry(draw(small), e.m, e.v) for i, e in state.entries.items()}
        state = AdamState(state.schema, state.config, entries, state.random_counter)
    return state


@_SETTINGS
@given(state=_states())
def test_codec_written_state_loads_and_saves_back_identically(state):
    if not state.schema.shapes:
        return  # torch cannot build an optimizer over no parameters
    event(f"tied={state.schema.has_aliases} dtype={state.config.dtype.value}")
    dtype = torch.float32 if state.config.dtype is MomentDtype.FLOAT32 else torch.float64
    params = _live(state.schema, dtype)
    opt = _optimizer(state, params)
    source = io.BytesIO()
    version = write_adam(source, state.schema, state.config, state.entries, state.random_counter)
    representable = all(float(np.float32(e.step)) == e.step for e in state.entries.values())
    snap = snapshot_optimizer(opt)
    source.seek(0)
    try:
        counter = load_optimizer(
            opt, params, source, restore_random_counter=state.random_counter is not None
        )
    except EntryError:
        assert not representable
        assert optimizer_unchanged(opt, snap)
        event("step refused")
        return
    event("loaded")
    assert representable and counter == state.random_counter
    for slot, entry in state.entries.items():
        live = opt.state[params[slot]]
        assert live["step"].item() == entry.step
        assert live["exp_avg"].reshape(-1).numpy().tobytes() == entry.m.tobytes()
        assert live["exp_avg_sq"].reshape(-1).numpy().tobytes() == entry.v.tobytes()
    again = io.BytesIO()
    assert save_optimizer(opt, params, again, random_counter=state.random_counter) == version
    assert again.getvalue() == source.getvalue()


@_SETTINGS
@given(arrays=float32_states())
def test_float32_state_loads_and_saves_back_identically(arrays):
    source = io.BytesIO()
    write_float32_state(source, arrays)
    dest = [torch.full(a.shape, -1.0) for a in arrays]
    source.seek(0)
    load_module_state(dest, source)
    for t, a in zip(dest, arrays):
        assert t.numpy().tobytes() == a.tobytes()
    again = io.BytesIO()
    save_module_state(dest, again)
    assert again.getvalue() == source.getvalue()


def _tied_file() -> tuple[list[torch.Tensor], torch.optim.Optimizer, bytes]:
    torch.manual_seed(0)
    p, q = torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(4))
    frozen = torch.randn(2)
    params = [p, frozen, p, q]
    opt = torch.optim.AdamW([p, q], lr=0.01)
    for _ in range(2):
        p.grad, q.grad = torch.randn(3, 2), torch.randn(4)
        opt.step()
    stream = io.BytesIO()
    save_optimizer(opt, params, stream, random_counter=3)
    return params, opt, stream.getvalue()


_PARAMS, _OPT, _FILE = _tied_file()


@settings(max_examples=300, deadline=None)
@given(mutant=byte_splices(_FILE))
def test_spliced_files_change_nothing_or_load_what_the_codec_reads(mutant: bytes):
    snap = snapshot_optimizer(_OPT)
    try:
        load_optimizer(_OPT, _PARAMS, io.BytesIO(mutant), restore_random_counter=True)
    except CheckpointError:
        assert optimizer_unchanged(_OPT, snap)
        return
    ckpt = read_adam(
        io.BytesIO(mutant),
        ParameterSchema([(3, 2), (2,), (3, 2), (4,)], [True, False, True, True], [0, None, 0, 3]),
    )
    for slot, entry in ckpt.entries.items():
        live = _OPT.state[_PARAMS[slot]]
        assert live["step"].item() == entry.step
        assert same(live["exp_avg"].reshape(-1), torch.from_numpy(entry.m))
    load_optimizer(_OPT, _PARAMS, io.BytesIO(_FILE), restore_random_counter=True)  # restore


def test_strategies_cover_tied_and_float64():
    """The property above really sees tied schemas and float64 moments."""
    seen = set()

    @settings(max_examples=80, deadline=None, database=None)
    @given(state=adam_states())
    def probe(state):
        seen.add((state.schema.has_aliases, state.config.dtype))

    probe()
    assert any(a for a, _ in seen) and any(d is MomentDtype.FLOAT64 for _, d in seen)
