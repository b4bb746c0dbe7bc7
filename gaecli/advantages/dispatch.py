"""The one dispatch: a spec (:class:`gaecli.advantages.spec.AdvantageSpec`) computed on one
packed batch by a kernel that supports it. The Python API (torch tensors) and the commands
(numpy buffers, :func:`gaecli.pipeline.compute_packed`) both call :func:`compute`; so does
:func:`gae_flat`, the public numpy form. Imports torch only when the batch is made of tensors
or the kernel has no numpy form."""

from __future__ import annotations

import warnings

import numpy as np

from gaecli.advantages.baselines import apply_semantics
from gaecli.advantages.contract import MASKED
from gaecli.advantages.kernels import KERNELS, device_type, resolve_kernel
from gaecli.advantages.spec import VARIANT_INPUTS, AdvantageSpec
from gaecli.errors import GAEInputError, KernelUnavailableError

# The torch dtypes (by name: this module does not import torch) a screened kernel reads.
SCREENED_VALUES = ("torch.float32", "torch.float64")
SCREENED_MASKS = (
    "torch.bool",
    "torch.uint8",
    "torch.int8",
    "torch.int16",
    "torch.int32",
    "torch.int64",
    *SCREENED_VALUES,
)


# The numpy dtypes (by name) a screened kernel reads on numpy buffers (the same as the above).
SCREENED_VALUE_DTYPES = ("float32", "float64")
SCREENED_MASK_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", *SCREENED_VALUE_DTYPES)


TEACHER_KL = "teacher-kl"
"""The per-token input of the pure on-policy distillation estimator ``opd``: the KL of the
student's log-probs from the teacher's (float64 ``[N]``; its advantage is minus it)."""

ROW_ADVANTAGE = "row-advantage"
"""The per-row input of an outcome estimator's per-token pass: each row's advantage (float64
``[B]``, :func:`gaecli.advantages.estimators.statistics_row_advantages`)."""


RESPONSE_MASK = "response-mask"
"""The per-token input of a trainer profile that reads its trainer's response mask (SkyRL's
``reinforce++``: ``G = G·response_mask_t``): bool ``[N]`` (``--response-mask-col``; absent: every
token of the row)."""


TOKEN_ADVANTAGE = "token-advantage"
TOKEN_RETURN = "token-return"
"""The per-token inputs of optimal-token-baseline's pass: each token's advantage and return
(float64 ``[N]``, :func:`gaecli.advantages.estimators.token_baseline_inputs`)."""


def compute(
    spec: AdvantageSpec,
    values,
    rewards,
    trainable,
    offsets,
    terminal_rewards,
    *,
    kernel: str = "auto",
    device=None,
    row_inputs=None,
):
    """Advantages and returns of one packed batch under ``spec``, before normalisation
    (whitening needs statistics over the whole input: :mod:`gaecli.advantages.whiten`; the
    ``reinforce++`` estimators' whitening too).

    Critic-free estimators (docs/estimators.md) read no values (``values`` may be None):
    ``reinforce++`` is masked GAE with V = 0 and λ = 1 on the kernel (advantages = returns =
    G); the outcome estimators need ``row_inputs[ROW_ADVANTAGE]``, each row's advantage from
    its group's statistics, which is written to the row's trainable tokens (returns the same).

    Shapes: flat ``[N]`` ``values``, ``rewards`` (one float dtype, which the outputs take)
    and bool ``trainable``; int64 ``offsets`` ``[B + 1]``; ``terminal_rewards`` ``[B]`` in the
    values' dtype. Returns flat ``(advantages, returns)`` ``[N]`` (docs/semantics.md).

    numpy arrays in, numpy arrays out: on the CPU a kernel with a numpy form (``native``)
    runs without importing torch; any other kernel, or ``device`` other than cpu, runs on
    tensors there and comes back. Torch tensors in, tensors out on their device (``device``
    is then theirs). ``kernel`` is resolved for the device and the spec
    (:func:`gaecli.advantages.kernels.resolve_kernel`: a kernel that cannot run the spec is
    refused, ``auto`` picks one that can). The inputs are not checked (the API and the
    commands check them first) and not modified.

    ``row_inputs``: the per-row inputs of the GAE variants the spec reads, by name
    (``spec.row_inputs``): numpy arrays or tensors, ``[B]`` for a scalar input, and for a
    list input (turn rewards) a pair ``(flat values [U], offsets [B + 1])``.
    """
    if spec.over_episodes and not spec.critic_free:
        raise ValueError(
            "masked GAE over episodes needs the episodes' carries: compute each row by "
            "gaecli.advantages.episodes.row_spec(spec) with the terminal rewards they settle"
        )
    if spec.critic_free:
        return _critic_free(spec, rewards, trainable, offsets, terminal_rewards, kernel, device, row_inputs)
    variants = variant_keywords(spec, row_inputs)
    if isinstance(values, np.ndarray):
        device = "cpu" if device is None else device
        entry = KERNELS[resolve_kernel(kernel, device, spec)]
        if entry.flat_function is not None and device_type(device) == "cpu":
            arrays = (values, rewards, trainable, offsets, terminal_rewards)
            return _run(spec, entry.flat_function, arrays, variants)
        offsets = offsets.astype(np.int64, copy=False)  # the torch kernels index with it
        arrays = (values, rewards, trainable, offsets, terminal_rewards)
        return _on_tensors(spec, entry.function, device, variants, *arrays)
    entry = KERNELS[resolve_kernel(kernel, values.device, spec)]
    return _run(spec, entry.function, (values, rewards, trainable, offsets, terminal_rewards), variants)


def variant_keywords(spec: AdvantageSpec, row_inputs=None) -> dict:
    """The keywords of the GAE variants a kernel is called with for ``spec`` (none for plain
    GAE): the spec's variant fields and its per-row inputs taken from ``row_inputs`` by name
    (a list input as ``turn_rewards`` plus ``turn_offsets``; the turn ids flat ``[N]``). Raises
    :class:`gaecli.errors.GAEInputError` for an input the spec reads that is not given."""
    if not spec.variants:
        return {}
    keywords = {"timestep": spec.timestep, "lambd_critic": spec.lambd_critic, "lambd_alpha": spec.lambd_alpha}
    keywords.update(lambd_schedule=spec.lambd_schedule, lambd_q=spec.lambd_q)
    row_inputs = row_inputs or {}
    for needed in spec.row_inputs:
        if needed.role not in VARIANT_INPUTS:
            continue
        if needed.name not in row_inputs:
            raise GAEInputError(f"spec reads per-row input {needed.name!r} ({needed.role}), which is not given")
        value = row_inputs[needed.name]
        if needed.role == "turn_rewards":
            keywords["turn_rewards"], keywords["turn_offsets"] = value
        else:
            keywords[needed.role] = value
    return keywords


def _critic_free(spec: AdvantageSpec, rewards, trainable, offsets, terminal_rewards, kernel, device, row_inputs):
    if spec.estimator == "reinforce++" and spec.semantics != MASKED:
        response = (row_inputs or {}).get(RESPONSE_MASK)
        returns = _profile_returns(spec, rewards, trainable, offsets, terminal_rewards, response)
        return returns, returns
    if spec.estimator in ("reinforce++", "remax"):
        returns_spec = AdvantageSpec(spec.gamma if spec.estimator == "reinforce++" else 1.0, 1.0)
        zeros = np.zeros_like(rewards) if isinstance(rewards, np.ndarray) else rewards.new_zeros(rewards.shape)
        returns, _ = compute(
            returns_spec, zeros, rewards, trainable, offsets, terminal_rewards, kernel=kernel, device=device
        )
        if spec.estimator == "reinforce++":
            return returns, returns
        baselines = _row_input(spec, row_inputs, spec.baseline_rewards, "the baseline rewards")
        return _spread(returns, baselines, trainable, offsets, combine="minus"), returns
    if spec.estimator == "agentic-reinforce":
        return _turn_returns(spec, rewards, trainable, offsets, terminal_rewards, kernel, device, row_inputs)
    if spec.estimator == "opd":
        teacher_kl = _row_input(spec, row_inputs, TEACHER_KL, "the KL from the teacher per token")
        advantages = _masked_negation(rewards, teacher_kl, trainable)
        return advantages, advantages
    if spec.estimator == "optimal-token-baseline":
        advantages = _row_input(spec, row_inputs, TOKEN_ADVANTAGE, "each token's advantage")
        returns = _row_input(spec, row_inputs, TOKEN_RETURN, "each token's return")
        return _like_rewards(rewards, advantages, trainable), _like_rewards(rewards, returns, trainable)
    row_values = _row_input(spec, row_inputs, ROW_ADVANTAGE, "each row's advantage")
    written = _written_tokens(spec, trainable, (row_inputs or {}).get(RESPONSE_MASK))
    advantages = _spread(rewards, row_values, written, offsets, combine="plus" if _adds_token_rewards(spec) else None)
    return advantages, advantages


def _adds_token_rewards(spec: AdvantageSpec) -> bool:
    """Whether ``spec``'s trainer profile adds each token's reward to the row's advantage
    (:attr:`gaecli.advantages.estimator_profiles.EstimatorProfile.token_rewards`)."""
    if spec.semantics == MASKED:
        return False
    from gaecli.advantages.estimators import trainer_profile

    return trainer_profile(spec).token_rewards


def _written_tokens(spec: AdvantageSpec, trainable, response=None):
    """Where an outcome estimator writes each row's advantage: the trainable tokens, or the
    response's tokens where its trainer profile writes there
    (:class:`gaecli.advantages.estimator_profiles.EstimatorProfile`): those of ``response``,
    the response mask, or every token without one."""
    if spec.semantics == MASKED:
        return trainable
    from gaecli.advantages.estimators import trainer_profile

    if trainer_profile(spec).written == "trainable":
        return trainable
    if response is not None:
        return response if isinstance(trainable, np.ndarray) else torch_like(response, trainable)
    if isinstance(trainable, np.ndarray):
        return np.ones_like(trainable)
    return trainable.new_ones(trainable.shape)


def torch_like(array, like):
    """``array`` (numpy or a tensor) as a tensor on ``like``'s device."""
    if isinstance(array, np.ndarray):
        import torch

        return torch.from_numpy(array).to(like.device)
    return array.to(like.device)


def _profile_returns(spec: AdvantageSpec, rewards, trainable, offsets, terminal_rewards, response=None):
    """A trainer profile's ``reinforce++`` returns (:func:`gaecli.advantages.estimator_profiles.reinforce_returns`,
    on numpy buffers: tensors go to the host and come back on their device); ``response``: the
    response mask (:data:`RESPONSE_MASK`), None without one."""
    from gaecli.advantages.estimator_profiles import reinforce_returns

    arrays = (rewards, trainable, offsets, terminal_rewards)
    response = None if response is None else _numpy(response)
    if isinstance(rewards, np.ndarray):
        return reinforce_returns(spec.semantics, *arrays, spec.gamma, response)
    import torch

    host = [array.detach().cpu().numpy() for array in arrays]
    returns = reinforce_returns(spec.semantics, *host, spec.gamma, response)
    return torch.from_numpy(returns).to(rewards.device)


def _turn_returns(spec: AdvantageSpec, rewards, trainable, offsets, terminal_rewards, kernel, device, row_inputs):
    """agentic-reinforce: each turn's reward ``R_u`` (the rewards at its trainable tokens,
    added in token order, then its turn reward; ``z`` on the last turn) discounted over the
    later turns, ``G_u = R_u + γ·G_{u+1}``, at every trainable token of turn ``u``: turn-level
    masked GAE with V = 0 and λ = 1 on the kernel, the runs' rewards given as its turn
    rewards. Advantages = returns; 0 at masked positions."""
    from gaecli.advantages.layout import run_rewards

    given = None if spec.turn_rewards is None else _row_input(spec, row_inputs, spec.turn_rewards, "the turn rewards")
    tensors = not isinstance(rewards, np.ndarray)
    arrays = [_numpy(array) for array in (rewards, trainable, offsets)]
    if given is not None:
        given = tuple(_numpy(part) for part in given)
    turn_rewards, turn_offsets = run_rewards(*arrays, given)
    turn_spec = AdvantageSpec(spec.gamma, 1.0, timestep="turn", turn_rewards="runs")
    zeros = np.zeros_like(arrays[0])
    terminal = _numpy(terminal_rewards).astype(zeros.dtype, copy=False)
    returns, _ = compute(
        turn_spec, zeros, zeros, arrays[1], arrays[2].astype(np.int64, copy=False), terminal, kernel=kernel,
        device="cpu" if tensors else device, row_inputs={"runs": (turn_rewards, turn_offsets)},
    )  # fmt: skip
    if tensors:
        import torch

        returns = torch.from_numpy(returns).to(rewards.device)
    return returns, returns


def _numpy(array):
    """``array`` as numpy (a tensor copied to the CPU; numpy as it is)."""
    return array if isinstance(array, np.ndarray) else array.detach().cpu().numpy()


def _row_input(spec: AdvantageSpec, row_inputs, name: str, what: str):
    values = (row_inputs or {}).get(name)
    if values is None:
        raise ValueError(f"estimator {spec.estimator!r}: row_inputs[{name!r}] ({what}) needed")
    return values


def _masked_negation(like, per_token, trainable):
    """``0 − per_token`` at trainable tokens (a KL of 0 gives +0), 0 at masked ones, in
    ``like``'s dtype and kind."""
    if isinstance(like, np.ndarray):
        return np.where(trainable, 0.0 - np.asarray(per_token, dtype=np.float64), 0.0).astype(like.dtype, copy=False)
    import torch

    per_token = torch.as_tensor(per_token, device=like.device, dtype=torch.float64)
    return torch.where(trainable, 0.0 - per_token, 0.0).to(like.dtype)


def _spread(like, row_values, trainable, offsets, combine=None):
    """Each row's value at its ``trainable`` tokens (``combine``: ``minus``, ``like`` minus it
    there, remax's return less its baseline; ``plus``, ``like`` plus it, a token's reward added
    to the row's advantage), 0 elsewhere, summed in float64 and rounded once to ``like``'s dtype
    (numpy arrays or tensors, as ``like``)."""
    if isinstance(like, np.ndarray):
        if combine is None:
            return spread_rows(row_values, trainable, offsets, like.dtype)
        per_token = np.repeat(np.asarray(row_values, dtype=np.float64), np.diff(offsets))
        own = like.astype(np.float64)
        combined = own - per_token if combine == "minus" else own + per_token
        return np.where(trainable, combined, 0.0).astype(like.dtype, copy=False)
    import torch

    lengths = offsets[1:] - offsets[:-1]
    per_token = torch.repeat_interleave(torch.as_tensor(row_values, device=like.device, dtype=torch.float64), lengths)
    if combine is not None:
        per_token = like.double() - per_token if combine == "minus" else like.double() + per_token
    return torch.where(trainable, per_token, 0.0).to(like.dtype)


def _like_rewards(rewards, per_token: np.ndarray, trainable):
    """Per-token float64 values ``[N]`` at trainable tokens, 0 at masked ones, in the rewards'
    dtype and kind (numpy array or tensor)."""
    if isinstance(rewards, np.ndarray):
        return np.where(trainable, per_token, 0.0).astype(rewards.dtype, copy=False)
    import torch

    values = torch.as_tensor(per_token, device=rewards.device, dtype=torch.float64)
    return torch.where(trainable, values, 0.0).to(rewards.dtype)


def spread_rows(row_values: np.ndarray, trainable: np.ndarray, offsets: np.ndarray, dtype) -> np.ndarray:
    """The per-token pass of the outcome estimators: each row's value at its trainable tokens,
    0 at masked positions; flat ``[N]`` in ``dtype``."""
    from gaecli.advantages.layout import spread_to_trainable

    return spread_to_trainable(row_values, trainable, offsets, dtype)


def _screening_kernel(spec: AdvantageSpec, kernel: str, device):
    """The kernel entry ``kernel`` resolves to on ``device`` for ``spec`` when a screened form
    of it may run: on the CPU, the ``masked`` semantics, no variant, not critic-free; else
    None (also when ``kernel`` does not resolve: the caller's general path checks the input
    first, then raises that)."""
    if spec.critic_free or spec.variants or spec.semantics != "masked" or device_type(device) != "cpu":
        return None
    try:
        return KERNELS[resolve_kernel(kernel, device, spec)]
    except KernelUnavailableError:
        return None


def screened_kernel(spec: AdvantageSpec, kernel: str = "auto", device="cpu"):
    """The screened numpy form (``Kernel.screened_function``: advantages, returns and whether
    its input was clean, in one pass) of the kernel ``kernel`` resolves to on ``device`` for
    ``spec``, or None when there is none (:func:`_screening_kernel`)."""
    entry = _screening_kernel(spec, kernel, device)
    return None if entry is None else entry.screened_function


def compute_screened_flat(
    screened, spec: AdvantageSpec, values, rewards, loss_mask, offsets, terminal_rewards, out=None
):
    """``screened`` (:func:`screened_kernel`) on flat numpy buffers: values and rewards of one
    dtype among :data:`SCREENED_VALUE_DTYPES`, the mask as stored (bool, integer or float 0/1:
    :data:`SCREENED_MASK_DTYPES`), int64 offsets, terminal rewards in the values' dtype.
    Returns ``(advantages, returns, clean)``: ``clean`` False when a value or reward was not
    finite or a mask value not 0 or 1 (which row is at fault is for the caller to find).
    ``out``: two arrays the kernel writes the outputs into (None: new ones)."""
    keywords = {} if out is None else {"out": out}
    return screened(values, rewards, loss_mask, offsets, terminal_rewards, gamma=spec.gamma, lambd=spec.lambd,
                    **keywords)  # fmt: skip


def compute_screened(
    spec: AdvantageSpec, values, rewards, loss_mask, offsets, terminal_rewards, *, kernel: str = "auto", out=None
):
    """:func:`compute` on CPU tensors by a kernel that screens its input in its own pass (the
    API's fast path: the checks that read every token cost nothing more). Returns
    ``(advantages, returns, clean)`` (``clean``: every value and reward finite, every mask
    value 0 or 1; see :func:`gaecli.advantages.kernels.native.native_gae_screened`), or None
    when this input cannot take that path: not on the CPU, ``kernel`` not resolved to a
    kernel with a screened form, a semantics other than ``masked``, or dtypes it does not
    read (values float32/float64, rewards the same, mask bool, integer or float). The tensors
    (mask: bool, integer or float 0/1 as given) are read in place and not modified. ``out``:
    two contiguous CPU tensors ``[N]`` of the values' dtype the kernel writes into."""
    if str(values.dtype) not in SCREENED_VALUES or rewards.dtype != values.dtype:
        return None
    if str(loss_mask.dtype) not in SCREENED_MASKS:
        return None
    screened = screened_kernel(spec, kernel, values.device)
    if screened is None:
        return None
    import torch

    # resolve_neg: a tensor with its negative bit set (Tensor.is_neg) holds its numbers negated.
    arrays = [
        tensor.detach().resolve_neg().numpy() for tensor in (values, rewards, loss_mask, offsets, terminal_rewards)
    ]
    buffers = None if out is None else tuple(tensor.detach().numpy() for tensor in out)
    advantages, returns, clean = compute_screened_flat(screened, spec, *arrays, out=buffers)
    if out is not None:
        return out[0], out[1], clean
    return torch.from_numpy(advantages), torch.from_numpy(returns), clean


def samples_kernel(spec: AdvantageSpec, kernel: str = "auto"):
    """The screened form over samples where they lie (``Kernel.samples_function``) of the
    kernel ``kernel`` resolves to on the CPU for ``spec``, or None when it has none, the
    semantics is not ``masked``, a variant is set, or ``kernel`` does not resolve (the
    caller's general path checks the input first, then raises that)."""
    entry = _screening_kernel(spec, kernel, "cpu")
    return None if entry is None else entry.samples_function


def compute_screened_samples(spec: AdvantageSpec, buffers, advantages, returns, *, kernel: str = "auto", samples=None):
    """:func:`compute_screened` on the list form's samples where they lie
    (:class:`gaecli.advantages.inputs.SampleBuffers`: CPU tensors, values float32/float64,
    rewards the same, mask bool, integer or float), read in place with no concatenation, into
    ``advantages`` and ``returns``: flat contiguous ``[N]`` CPU tensors of the values' dtype,
    sample ``i`` at ``buffers.offsets[i]:buffers.offsets[i + 1]`` (views of them may be taken
    before: each position is written once). ``samples``: the kernel :func:`samples_kernel`
    gives for ``spec`` and ``kernel``, when the caller has it already. Returns ``clean``, or
    None when :func:`samples_kernel` has no kernel for ``kernel`` (nothing written then)."""
    if samples is None:
        samples = samples_kernel(spec, kernel)
        if samples is None:
            return None
    from gaecli.advantages.inputs import numpy_dtype

    addresses = buffers.addresses
    starts = buffers.offsets[:-1] * advantages.element_size()
    np.add(starts, advantages.data_ptr(), out=addresses[3])
    np.add(starts, returns.data_ptr(), out=addresses[4])
    return samples(
        addresses,
        buffers.offsets,
        buffers.terminal,
        value_dtype=numpy_dtype(advantages.dtype),
        mask_dtype=numpy_dtype(buffers.mask_dtype),
        gamma=spec.gamma,
        lambd=spec.lambd,
    )


def _run(spec: AdvantageSpec, function, arrays: tuple, variants):
    """``function`` under ``spec``'s semantics on ``arrays`` (values, rewards, trainable,
    offsets, terminal rewards)."""
    offsets = arrays[3]

    def run(v, r, m, z):
        return function(v, r, m, offsets, z, gamma=spec.gamma, lambd=spec.lambd, **variants)

    discount = {"gamma": spec.gamma, "lambd": spec.lambd}
    return apply_semantics(run, *arrays, **discount, semantics=spec.semantics)


def runs_on_tensors(spec: AdvantageSpec, kernel: str, device) -> bool:
    """Whether :func:`compute` of numpy buffers for ``spec`` runs a torch kernel on tensors
    (any kernel without a numpy form, any device but the CPU), so that the buffers are
    uploaded (:func:`device_tensors`); a critic-free estimator's other steps stay in numpy."""
    entry = KERNELS[resolve_kernel(kernel, device, spec)]
    return entry.flat_function is None or device_type(device) != "cpu"


def device_tensors(arrays, device) -> list:
    """Numpy buffers as tensors on ``device`` (shared with the buffers on the CPU, copied
    once to any other device)."""
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensors = [torch.from_numpy(array) for array in arrays]
    if device_type(device) != "cpu":
        tensors = [tensor.to(device) for tensor in tensors]
    return tensors


def as_numpy(outputs) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns tensors back as numpy on the host (one array when they are one
    tensor)."""
    advantages, returns = outputs
    host = advantages.cpu().numpy()
    return host, host if returns is advantages else returns.cpu().numpy()


def _on_tensors(spec: AdvantageSpec, function, device, variants, *arrays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Numpy buffers through a torch kernel on ``device``, back as numpy (the variants'
    per-row inputs stay as given: the kernels that take them read numpy or tensors)."""
    advantages, returns = _run(spec, function, tuple(device_tensors(arrays, device)), variants)
    return advantages.cpu().numpy(), returns.cpu().numpy()


def gae_flat(
    values: np.ndarray,
    rewards: np.ndarray,
    trainable: np.ndarray,
    offsets: np.ndarray,
    terminal_rewards: np.ndarray,
    *,
    gamma: float,
    lambd: float,
    semantics: str = "masked",
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns ``[N]`` (the values' dtype) on flat numpy buffers with the
    ``native`` kernel, without torch: :func:`compute` of ``AdvantageSpec(gamma, lambd,
    semantics)``. Shapes as :func:`compute`; the inputs are not checked (the commands check
    every batch before) and not modified."""
    spec = AdvantageSpec(gamma, lambd, semantics)
    return compute(spec, values, rewards, trainable, offsets, terminal_rewards, kernel="native", device="cpu")
