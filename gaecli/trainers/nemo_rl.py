"""NeMo-RL's GAE estimator with NeMo-RL's constructor and method
(``nemo_rl/algorithms/advantage_estimator.py``, ``GeneralizedAdvantageEstimator``,
NVIDIA-NeMo/RL ``7ea279a``; docs/trainers.md#nemo-rl): padded ``[B, S]`` tensors, a scalar
reward per sample, the masked contract by default or NeMo-RL's own computation with
``semantics="nemo-rl"`` (a keyword of the constructor). Importing this module does not import
NeMo-RL."""

from __future__ import annotations

from gaecli.advantages.contract import MASKED
from gaecli.errors import GAEInputError
from gaecli.trainers.padded import as_trainable, check_batch, check_semantics
from gaecli.trainers.row_lambda import padded_lambda_gae

PROFILE = "nemo-rl"
"""gaecli's profile of NeMo-RL (docs/semantics.md#the-baselines)."""

KL_INPUT_CLAMP = 20.0
KL_OUTPUT_CLAMP = 10.0
"""NeMo-RL's ``calculate_kl`` clamps the log-ratio to ±20 and the estimate to ±10."""


def calculate_kl(logprobs, logprobs_reference, kl_type: str = "k3"):
    """NeMo-RL's per-token KL estimate (``nemo_rl/algorithms/utils.py``, ``calculate_kl`` with
    its default clamps), in the log-probs' dtype: ``logr = ref − logprobs`` clamped to ±20;
    ``k1`` ``−logr``, ``k2`` ``logr²/2``, ``k3`` ``exp(logr) − 1 − logr``; clamped to ±10."""
    import torch

    logr = (logprobs_reference - logprobs).clamp(min=-KL_INPUT_CLAMP, max=KL_INPUT_CLAMP)
    if kl_type == "k1":
        kl = -logr
    elif kl_type == "k2":
        kl = torch.square(logr) / 2
    elif kl_type == "k3":
        kl = torch.exp(logr) - 1 - logr
    else:
        raise GAEInputError(f"Invalid KL type: {kl_type!r} (k1, k2 or k3)")
    return kl.clamp(min=-KL_OUTPUT_CLAMP, max=KL_OUTPUT_CLAMP)


class GeneralizedAdvantageEstimator:
    """NeMo-RL's ``GeneralizedAdvantageEstimator``: the same constructor (``estimator_config``
    with ``gae_lambda``, ``gae_gamma``, ``normalize_advantages``, ``gae_lambda_value``,
    ``gae_lambda_policy``, ``length_adaptive_alpha``; ``loss_config`` with
    ``use_kl_in_reward``, ``reference_policy_kl_penalty``, ``reference_policy_kl_type``) and
    :meth:`compute_advantage`; ``semantics`` (``masked`` or ``nemo-rl``), the one keyword
    added, chooses what every call computes."""

    def __init__(self, estimator_config, loss_config, *, semantics: str = MASKED):
        self.gae_lambda = estimator_config["gae_lambda"]
        self.gae_gamma = estimator_config["gae_gamma"]
        self.normalize_advantages = estimator_config["normalize_advantages"]
        self.gae_lambda_value = estimator_config["gae_lambda_value"]
        self.gae_lambda_policy = estimator_config["gae_lambda_policy"]
        self.length_adaptive_alpha = estimator_config["length_adaptive_alpha"]
        self.use_kl_in_reward = loss_config.use_kl_in_reward
        self.kl_coef = loss_config.reference_policy_kl_penalty
        self.kl_type = loss_config.reference_policy_kl_type
        self.semantics = check_semantics(semantics, (MASKED, PROFILE))

    def compute_advantage(self, prompt_ids, rewards, mask, values, reference_logprobs=None, logprobs=None, **kwargs):
        """``(advantages, returns)`` ``[B, S]`` of ``rewards`` ``[B]`` (one per sample),
        ``mask`` ``[B, S]`` (0/1: the trainable tokens) and ``values`` ``[B, S]``; the per-token
        rewards NeMo-RL builds: ``−kl_coef · KL`` at every token when ``use_kl_in_reward``
        (and both log-probs given), the sample's reward on its last mask-1 token (dropped when
        it has none), times the mask. ``prompt_ids`` and other keywords are not read. λ as
        NeMo-RL resolves it: the returns with ``gae_lambda_value`` (or ``gae_lambda``), the
        advantages with the length-adaptive λ ``clamp(1 − 1/max(α·l, 1), 0, 1)`` (l: the
        row's mask-1 tokens, float32) when ``length_adaptive_alpha > 0``, else
        ``gae_lambda_policy`` (or ``gae_lambda``). With ``normalize_advantages`` the
        advantages are whitened over the mask-1 tokens by NeMo-RL's rule
        (``NORM_LIKE["nemo-rl"]``: ``(A − mean)·rsqrt(var + 1e-8)``, the mean ``Σ/(n + 1e-8)``,
        the variance about it ``Σ(A − mean)²/(n + 1e-8) · n/(n − 1)``; statistics in float64;
        one mask-1 token whitens to 0), in both modes. Tensors stay on their device, in the
        values' dtype.

        ``masked``: the masked contract over the mask-1 tokens (NeMo-RL's advantages at them),
        advantages and returns exactly 0 at every masked and padding position. ``nemo-rl``:
        NeMo-RL's carry-forward loop as :func:`gaecli.baseline_gae_packed` gives it: the
        advantages 0 at masked positions, the returns there carry + V."""
        from gaecli.advantages.normalization import NORM_LIKE
        from gaecli.advantages.whiten import whiten

        check_batch("compute_advantage", values, mask)
        if rewards.shape != (values.shape[0],):
            shape = tuple(rewards.shape)
            raise GAEInputError(f"compute_advantage: rewards must be [batch] ({values.shape[0]}), got {shape}")
        token_rewards = self._token_level_rewards(rewards, mask, logprobs, reference_logprobs).to(values.dtype)
        lam_value = self.gae_lambda if self.gae_lambda_value is None else self.gae_lambda_value
        lam_policy = self._policy_lambda(mask)
        decoupled = self.gae_lambda_value is not None or self.gae_lambda_policy is not None
        if decoupled or self.length_adaptive_alpha > 0:
            _, returns = self._gae(values, token_rewards, mask, lam_value)
            advantages, _ = self._gae(values, token_rewards, mask, lam_policy)
        else:
            advantages, returns = self._gae(values, token_rewards, mask, self.gae_lambda)
        if self.normalize_advantages:
            trainable = as_trainable(mask).reshape(-1)
            whitened = whiten(advantages.reshape(-1), trainable, NORM_LIKE[PROFILE], written="trainable")
            advantages = whitened.reshape(advantages.shape)
        return advantages, returns

    def _token_level_rewards(self, rewards, mask, logprobs, reference_logprobs):
        """NeMo-RL's ``_build_token_level_rewards`` (vectorised): ``[B, S]``."""
        import torch

        trainable = as_trainable(mask)
        token_rewards = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
        if self.use_kl_in_reward and self.kl_coef > 0 and logprobs is not None and reference_logprobs is not None:
            token_rewards = token_rewards - self.kl_coef * calculate_kl(logprobs, reference_logprobs, self.kl_type)
        positions = torch.arange(mask.shape[1], device=mask.device)
        last = torch.where(trainable, positions, -1).amax(dim=1, keepdim=True)
        zero = torch.zeros((), dtype=token_rewards.dtype, device=token_rewards.device)
        outcome = rewards.unsqueeze(1).to(token_rewards.dtype)
        token_rewards = token_rewards + torch.where(positions == last, outcome, zero)
        return torch.where(trainable, token_rewards, zero)

    def _policy_lambda(self, mask):
        """The λ of the advantages: NeMo-RL's ``_resolve_lambda_policy`` (a float32 ``[B]``
        tensor for the length-adaptive λ, else a number)."""
        if self.length_adaptive_alpha > 0:
            lengths = as_trainable(mask).sum(dim=1).float()
            return (1.0 - 1.0 / (self.length_adaptive_alpha * lengths).clamp(min=1.0)).clamp(min=0.0, max=1.0)
        return self.gae_lambda if self.gae_lambda_policy is None else self.gae_lambda_policy

    def _gae(self, values, token_rewards, mask, lambd):
        """GAE under this estimator's semantics with ``lambd`` (a number or a tensor per row)."""
        return padded_lambda_gae(values, token_rewards, mask, self.gae_gamma, lambd, self.semantics)
