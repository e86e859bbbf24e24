"""Whether an optimizer's state fits one of TorchLean's ``TLADAMF`` versions, and if not, why.

The state is described in the codec's terms (param groups, each slot's group, each slot's
dtype, which slots have state), so the same rule decides what ``save_optimizer`` writes, what
a ``TLADAMF`` load accepts, and whether a ``TLCKOPT`` destination can take a ``TLADAMF`` file
(``tlckpt validate --against``). A state fits when

* every param group that manages a trainable slot has the same kind, betas, eps and weight
  decay, bit for bit (the learning rate may differ: TorchLean's files have none), and none has
  amsgrad or maximize;
* that config is one TorchLean has: no ``torch.optim.Adam`` with (L2) weight decay, an eps
  that is positive and finite in the moment dtype, finite betas and weight decay;
* the moments are float32 or float64, one dtype for every trainable slot;
* every trainable slot (representative slot) has state, and no frozen slot has (TorchLean's
  schema forbids a frozen slot owning state; torch keeps a parameter's state when it is
  frozen, as gradual unfreezing does).

Anything else is tlckpt's own family (:mod:`tlckpt.formats.tlckpt_optimizer`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...formats.adam import AdamKind
from ..errors import ConfigError
from ..values.config import AdamConfig, MomentDtype
from ..values.destinations import AdamTarget, OptimizerTarget
from ..values.optimizer_types import ParamGroupConfig
from ..values.schema import ParameterSchema

__all__ = ["Misfit", "TorchLeanFit", "torchlean_fit", "adam_target_of"]

_TORCHLEAN_DTYPES = {d.value: d for d in MomentDtype}


@dataclass(frozen=True)
class Misfit:
    """One reason a state does not fit TorchLean's versions.

    Attributes:
        message: what does not fit, naming the group or slot.
        field: where (``param_groups[1].amsgrad``, ``slot 21``).
    """

    message: str
    field: str | None = None

    def error(self) -> ConfigError:
        """The reason as the error a ``TLADAMF`` save or load raises."""
        return ConfigError(self.message, field=self.field)


@dataclass(frozen=True)
class TorchLeanFit:
    """The verdict: the ``TLADAMF`` config when the state fits, else every reason it does not.

    Attributes:
        config: the one config (its moment dtype ``None`` when no trainable slot's dtype is
            known), or ``None`` when the groups cannot be one config.
        misfits: every reason the state does not fit; empty when it does.
    """

    config: AdamConfig | None
    dtype_known: bool
    misfits: tuple[Misfit, ...]

    @property
    def fits(self) -> bool:
        """Whether the state is a ``TLADAMF`` file's."""
        return not self.misfits

    def require(self) -> AdamConfig:
        """The config, or the first reason as a :class:`ConfigError` (what a ``TLADAMF``
        load into this optimizer raises)."""
        if self.misfits or self.config is None:
            raise (self.misfits[0] if self.misfits else Misfit("no config")).error()
        return self.config

    def refusal(
        self, lead: str = "this optimizer state does not fit TorchLean's TLADAMF versions"
    ) -> ConfigError:
        """Every reason as one :class:`ConfigError` (``require_torchlean=True``), after
        ``lead``."""
        listed = "; ".join(m.message for m in self.misfits)
        return ConfigError(
            f"{lead}: {listed}", field=self.misfits[0].field if self.misfits else None
        )


def _slot(i: int) -> str:
    return f"slot {i}"


def torchlean_fit(
    schema: ParameterSchema,
    groups: Sequence[ParamGroupConfig],
    slot_groups: Sequence[int | None],
    dtypes: Sequence[str | None],
    *,
    has_state: Callable[[int], bool] | None = None,
    label: Callable[[int], str] = _slot,
) -> TorchLeanFit:
    """Decide whether a state fits TorchLean's versions (see the module docstring).

    Args:
        schema: the parameter schema.
        groups: the optimizer's param groups, in order.
        slot_groups: per slot, the index of its group (``None`` for aliases and for frozen
            slots that cannot hold state).
        dtypes: per slot, its moment dtype's name (the parameter's dtype), ``None`` if unknown.
        has_state: whether a slot that has a group has state (``None``: every representative
            slot has, no frozen slot has).
        label: how messages name a slot.

    Returns:
        The :class:`TorchLeanFit`.
    """
    owners = schema.representative_slots
    misfits: list[Misfit] = []
    used = sorted({g for i in owners if (g := slot_groups[i]) is not None})
    if not used and groups:
        used = [0]  # nothing trainable: the first group's config is the file's
    for g in used:
        if groups[g].amsgrad:
            misfits.append(
                Misfit(
                    f"param group {g} has amsgrad=True: its max_exp_avg_sq history has no"
                    " place in a TorchLean Adam checkpoint",
                    f"param_groups[{g}].amsgrad",
                )
            )
        if groups[g].maximize:
            misfits.append(
                Misfit(
                    f"param group {g} has maximize=True, which a TorchLean Adam checkpoint"
                    " cannot say",
                    f"param_groups[{g}].maximize",
                )
            )

    dtype = _moment_dtype(schema, dtypes, label, misfits)
    config = None
    if used:
        first = used[0]
        configs = {g: _config(groups[g], dtype or MomentDtype.FLOAT32) for g in used}
        for g in used[1:]:
            diffs = configs[g].differences(configs[first])
            if diffs:
                misfits.append(
                    Misfit(
                        f"param group {g} differs from group {first} ({'; '.join(diffs)});"
                        " a TorchLean checkpoint has one config for all parameters",
                        f"param_groups[{g}]",
                    )
                )
        config = configs[first]
        if config.kind is AdamKind.ADAM and config.weight_decay != 0.0:
            misfits.append(
                Misfit(
                    f"torch.optim.Adam with weight_decay={config.weight_decay!r} adds L2 decay"
                    " to the gradient, which TorchLean's Adam does not have (use"
                    " torch.optim.AdamW for decoupled weight decay, or weight_decay=0)",
                    "weight_decay",
                )
            )
        else:
            try:
                config.validate()
            except ConfigError as exc:
                misfits.append(Misfit(f"TorchLean's config: {exc.reason}", exc.field))

    if has_state is not None and owners:
        missing = [i for i in owners if not has_state(i)]
        if len(missing) == len(owners):
            misfits.append(
                Misfit("the optimizer has no state yet (no optimizer step has been taken)")
            )
        else:
            misfits += [
                Misfit(
                    f"trainable {label(i)} has no optimizer state yet (it has not had a"
                    " gradient in an optimizer step)",
                    f"slot {i}",
                )
                for i in missing
            ]
    if has_state is not None:
        misfits += [
            Misfit(
                f"frozen {label(i)} has optimizer state (kept from before it was frozen);"
                " TorchLean's TLADAMF versions forbid a frozen slot owning state, so only"
                " tlckpt's own TLCKOPT family keeps it",
                f"slot {i}",
            )
            for i, g in enumerate(slot_groups)
            if g is not None and schema.representative(i) is None and has_state(i)
        ]
    return TorchLeanFit(config, dtype is not None, tuple(misfits))


def _config(group: ParamGroupConfig, dtype: MomentDtype) -> AdamConfig:
    return AdamConfig(
        group.kind, group.beta1, group.beta2, group.epsilon, group.weight_decay, dtype
    )


def _moment_dtype(
    schema: ParameterSchema,
    dtypes: Sequence[str | None],
    label: Callable[[int], str],
    misfits: list[Misfit],
) -> MomentDtype | None:
    """The one TorchLean moment dtype of the trainable slots; ``None`` (with the reason
    noted) when there is none, or when no trainable slot's dtype is known."""
    owners = schema.representative_slots
    if not owners:
        # Nothing trainable: no moment exists, but the file's dtype still follows the model.
        known = {d for d in dtypes if d is not None}
        only = known.pop() if len(known) == 1 else MomentDtype.FLOAT32.value
        return _TORCHLEAN_DTYPES.get(only, MomentDtype.FLOAT32)
    found: dict[str, int] = {}
    for i in owners:
        if dtypes[i] is not None:
            found.setdefault(dtypes[i], i)
    for name, i in found.items():
        if name not in _TORCHLEAN_DTYPES:
            misfits.append(
                Misfit(
                    f"{label(i)} is {name}: TorchLean checkpoints hold float32 or float64"
                    " moments only",
                    f"slot {i}",
                )
            )
            return None
    if len(found) > 1:
        listed = ", ".join(f"{label(i)} is {d}" for d, i in found.items())
        misfits.append(
            Misfit(
                f"parameters have different dtypes ({listed}); a TorchLean checkpoint has one"
                " moment dtype"
            )
        )
        return None
    return _TORCHLEAN_DTYPES[next(iter(found))] if found else None


def adam_target_of(target: OptimizerTarget) -> AdamTarget:
    """What a ``TLADAMF`` file must be to load into the optimizer ``target`` describes.

    The moment dtype is ``None`` (either: the config is then compared in the file's dtype)
    when no trainable slot's dtype is known; the config is ``None`` when the groups are not
    known.

    Raises:
        ConfigError: the optimizer's state cannot be a ``TLADAMF`` file (every reason).
    """
    schema = target.schema
    if target.groups is None or target.slot_groups is None:
        return AdamTarget(schema, None, None)
    dtypes = target.dtypes if target.dtypes is not None else (None,) * len(schema)
    fit = torchlean_fit(schema, target.groups, target.slot_groups, dtypes)
    if not fit.fits:
        raise fit.refusal("no TLADAMF file loads into this optimizer")
    return AdamTarget(schema, fit.config.dtype if fit.dtype_known else None, fit.config)
