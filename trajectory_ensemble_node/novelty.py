"""Observation novelty: how far an observation's embedding lies from the ones a policy was calibrated on.

Two scorers over standardized embeddings, ``rnd`` (random network distillation, FIPER's) and ``knn`` (distance to the
k-th nearest fit embedding); a scorer records its embedding and grid, so a node refuses one that does not fit its
model (docs/safety-and-uncertainty.md). A fitted scorer is one safetensors file; pickle is never written or read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import NoveltyScorerError

SCORER_KINDS = ("rnd", "knn")
"""Values of ``calibrate --scorer`` and of a scorer file's ``kind``."""
FILE_FORMAT = "trajectory_ensemble.novelty"
FILE_VERSION = "1"
SUFFIX = ".safetensors"
DEFAULT_HIDDEN = 256
DEFAULT_OUTPUT = 64
DEFAULT_FIT_STEPS = 2000
DEFAULT_K = 1
_MIN_SCALE = 1e-6


@dataclass(frozen=True)
class NoveltyReport:
    """A group's observation novelty as a result reports it (``None``: not reported).

    Args:
        score (`float`, *optional*): ``novelty_score``, the scorer's score of the group's observation embedding.
        fault (`str`, *optional*): ``novelty_fault``, why a non-finite score was read as novel.
        threshold (`float`, *optional*): ``novelty_threshold``, the calibrated threshold in force.
        novel (`bool`, *optional*): ``novel``, the score above the threshold (or a node window's mean above it).
        score_window (`float`, *optional*): ``novelty_score_window``, the mean over a node's aggregation window.
    """

    score: float | None = None
    fault: str | None = None
    threshold: float | None = None
    novel: bool | None = None
    score_window: float | None = None

    def as_metrics(self) -> dict[str, Any]:
        """The entries that are set, in the order results carry them."""
        entries = (("novelty_score", self.score), ("novelty_fault", self.fault),
                   ("novelty_threshold", self.threshold), ("novel", self.novel),
                   ("novelty_score_window", self.score_window))
        return {key: value for key, value in entries if value is not None}

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> NoveltyReport | None:
        """The novelty entries of a flat metrics mapping; ``None`` when it has none (no scorer configured)."""
        report = cls(metrics.get("novelty_score"), metrics.get("novelty_fault"), metrics.get("novelty_threshold"),
                     metrics.get("novel"), metrics.get("novelty_score_window"))
        return None if report == cls() else report


@dataclass(frozen=True)
class EmbeddingSpec:
    """Which observation embedding a scorer reads.

    Args:
        name (`str`): What the embedding is (e.g. ``"conditioning_latent"``), as the model adapter names it.
        grid (`int`): Spatial pooling grid of the embedding (``grid x grid`` cells per channel).
        dim (`int`): Length of the flat embedding vector.
    """

    name: str
    grid: int
    dim: int

    def __post_init__(self) -> None:
        if not self.name or self.grid < 1 or self.dim < 1:
            raise NoveltyScorerError(f"embedding spec needs a name, grid >= 1 and dim >= 1, got {self!r}")


def _mlp(dim: int, hidden: int, out: int) -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.LeakyReLU(), torch.nn.Linear(hidden, out))


class NoveltyScorer:
    """Base of the two scorers: standardization, the shape check, and the file format.

    Args:
        embedding (`EmbeddingSpec`): The embedding it reads.
        mean (`torch.Tensor` of shape `[D]`), scale (`torch.Tensor` of shape `[D]`): Standardization of the fit set.
    """

    kind = ""

    def __init__(self, embedding: EmbeddingSpec, mean: torch.Tensor, scale: torch.Tensor) -> None:
        if mean.shape != (embedding.dim,) or scale.shape != (embedding.dim,):
            raise NoveltyScorerError(f"mean and scale must be [{embedding.dim}], got {tuple(mean.shape)} and "
                                     f"{tuple(scale.shape)}")
        self.embedding = embedding
        self.mean = mean.to(torch.float32)
        self.scale = scale.to(torch.float32).clamp_min(_MIN_SCALE)

    def _standardize(self, embeddings: torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(embeddings).detach().to("cpu", torch.float32)
        if x.ndim == 1:
            x = x[None]
        if x.ndim != 2 or x.shape[1] != self.embedding.dim:
            raise NoveltyScorerError(
                f"embedding of shape {tuple(torch.as_tensor(embeddings).shape)} does not fit this scorer, which reads "
                f"{self.embedding.name!r} of length {self.embedding.dim} (grid {self.embedding.grid})")
        if not torch.isfinite(x).all():
            raise NoveltyScorerError("embedding holds NaN or Inf")
        return (x - self.mean) / self.scale

    def scores(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Novelty of each embedding (higher = less familiar).

        Args:
            embeddings (`torch.Tensor` of shape `[M, D]` or `[D]`): Flat embeddings.

        Returns:
            `torch.Tensor` of shape `[M]`, float64.

        Raises:
            NoveltyScorerError: wrong length, or non-finite values.
        """
        with torch.no_grad():
            return self._scores(self._standardize(embeddings)).to(torch.float64)

    def score(self, embedding: torch.Tensor) -> float:
        """Novelty of one embedding ``[D]``."""
        return float(self.scores(embedding)[0])

    def _scores(self, z: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _tensors(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _metadata(self) -> dict[str, str]:
        return {}

    def save(self, path: str | Path) -> str:
        """Write the scorer as one safetensors file; returns its sha256 (hex), which ``calibrate`` records.

        Raises:
            NoveltyScorerError: ``path`` does not end in ``.safetensors``, or a tensor holds NaN or Inf.
        """
        from safetensors.torch import save_file

        path = Path(path)
        if path.suffix != SUFFIX:
            raise NoveltyScorerError(f"a novelty scorer is written as {SUFFIX}, got {str(path)!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        metadata = {"format": FILE_FORMAT, "version": FILE_VERSION, "kind": self.kind,
                    "embedding": self.embedding.name, "grid": str(self.embedding.grid),
                    "dim": str(self.embedding.dim), **self._metadata()}
        tensors = {"mean": self.mean, "scale": self.scale, **self._tensors()}
        check_finite_tensors(tensors, f"novelty scorer for {str(path)!r}")
        save_file({k: v.detach().contiguous().to(torch.float32) for k, v in tensors.items()}, str(path),
                  metadata=metadata)
        return file_sha256(path)


class RNDScorer(NoveltyScorer):
    """Random network distillation: score = mean squared gap between a trained predictor and a fixed random target.

    Args:
        embedding (`EmbeddingSpec`), mean, scale: See :class:`NoveltyScorer`.
        target (`torch.nn.Sequential`), predictor (`torch.nn.Sequential`): ``Linear(D, H) -> LeakyReLU ->
            Linear(H, O)`` each; the target is never trained.
    """

    kind = "rnd"

    def __init__(self, embedding: EmbeddingSpec, mean: torch.Tensor, scale: torch.Tensor,
                 target: torch.nn.Sequential, predictor: torch.nn.Sequential) -> None:
        super().__init__(embedding, mean, scale)
        self.target, self.predictor = target.eval(), predictor.eval()
        for p in list(self.target.parameters()) + list(self.predictor.parameters()):
            p.requires_grad_(False)

    @classmethod
    def fit(cls, embeddings: torch.Tensor, embedding: EmbeddingSpec, *, hidden: int = DEFAULT_HIDDEN,
            out: int = DEFAULT_OUTPUT, steps: int = DEFAULT_FIT_STEPS, seed: int = 0, lr: float = 3e-3,
            weight_decay: float = 1e-4) -> RNDScorer:
        """Draw the target from ``seed`` and train the predictor on ``embeddings`` (full batch, Adam).

        Args:
            embeddings (`torch.Tensor` of shape `[M, D]`): Fit set (M >= 2).
            embedding (`EmbeddingSpec`): What they are.
            hidden (`int`), out (`int`): Widths of both MLPs.
            steps (`int`): Adam steps.
            seed (`int`): Seeds the target, the predictor's initialization and nothing else (deterministic on CPU).
        """
        x = _fit_matrix(embeddings, embedding)
        mean, scale = x.mean(dim=0), x.std(dim=0, unbiased=False).clamp_min(_MIN_SCALE)
        z = (x - mean) / scale
        with torch.random.fork_rng(devices=[]):  # the caller's global RNG stream is left as it was
            torch.manual_seed(int(seed))
            target, predictor = _mlp(embedding.dim, hidden, out), _mlp(embedding.dim, hidden, out)
        for p in target.parameters():
            p.requires_grad_(False)
        with torch.enable_grad():
            optimizer = torch.optim.Adam(predictor.parameters(), lr=lr, weight_decay=weight_decay)
            goal = target(z)
            for _ in range(int(steps)):
                loss = (predictor(z) - goal).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        return cls(embedding, mean, scale, target, predictor)

    def _scores(self, z: torch.Tensor) -> torch.Tensor:
        return (self.predictor(z) - self.target(z)).pow(2).mean(dim=1)

    def _tensors(self) -> dict[str, torch.Tensor]:
        out = {f"target.{k}": v for k, v in self.target.state_dict().items()}
        out.update({f"predictor.{k}": v for k, v in self.predictor.state_dict().items()})
        return out

    def _metadata(self) -> dict[str, str]:
        first = self.target[0]
        return {"hidden": str(first.out_features), "out": str(self.target[2].out_features)}


class KNNScorer(NoveltyScorer):
    """k nearest neighbours: score = Euclidean distance (standardized space) to the k-th nearest fit embedding.

    Args:
        embedding (`EmbeddingSpec`), mean, scale: See :class:`NoveltyScorer`.
        reference (`torch.Tensor` of shape `[M, D]`): Standardized fit embeddings.
        k (`int`): Which neighbour (1 = the nearest); at most M.
    """

    kind = "knn"

    def __init__(self, embedding: EmbeddingSpec, mean: torch.Tensor, scale: torch.Tensor, reference: torch.Tensor,
                 k: int = DEFAULT_K) -> None:
        super().__init__(embedding, mean, scale)
        if reference.ndim != 2 or reference.shape[1] != embedding.dim or not 1 <= k <= reference.shape[0]:
            raise NoveltyScorerError(f"reference must be [M, {embedding.dim}] with 1 <= k <= M, got "
                                     f"{tuple(reference.shape)} and k={k!r}")
        self.reference = reference.to(torch.float32)
        self.k = int(k)

    @classmethod
    def fit(cls, embeddings: torch.Tensor, embedding: EmbeddingSpec, *, k: int = DEFAULT_K) -> KNNScorer:
        """Keep the standardized ``embeddings`` ``[M, D]`` as the reference set."""
        x = _fit_matrix(embeddings, embedding)
        mean, scale = x.mean(dim=0), x.std(dim=0, unbiased=False).clamp_min(_MIN_SCALE)
        return cls(embedding, mean, scale, (x - mean) / scale, k=k)

    def _scores(self, z: torch.Tensor) -> torch.Tensor:
        distance = torch.cdist(z.double(), self.reference.double(), compute_mode="donot_use_mm_for_euclid_dist")
        return distance.sort(dim=1).values[:, self.k - 1]

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {"reference": self.reference}

    def _metadata(self) -> dict[str, str]:
        return {"k": str(self.k)}


def _fit_matrix(embeddings: torch.Tensor, embedding: EmbeddingSpec) -> torch.Tensor:
    x = torch.as_tensor(embeddings).detach().to("cpu", torch.float32)
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] != embedding.dim:
        raise NoveltyScorerError(f"fit embeddings must be [M >= 2, {embedding.dim}], got {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise NoveltyScorerError("fit embeddings hold NaN or Inf")
    return x


def fit_scorer(kind: str, embeddings: torch.Tensor, embedding: EmbeddingSpec, *, seed: int = 0,
               **options: Any) -> NoveltyScorer:
    """Fit a scorer of ``kind`` (one of :data:`SCORER_KINDS`) on ``embeddings`` ``[M, D]``.

    Raises:
        NoveltyScorerError: unknown kind (quoted) or a bad fit set.
    """
    if kind == "rnd":
        return RNDScorer.fit(embeddings, embedding, seed=seed, **options)
    if kind == "knn":
        return KNNScorer.fit(embeddings, embedding, **options)
    raise NoveltyScorerError(f"novelty scorer kind must be one of {list(SCORER_KINDS)}, got {kind!r}")


def check_finite_tensors(tensors: dict[str, torch.Tensor], what: str) -> None:
    """Refuse a scorer whose tensors hold NaN or Inf, or whose standardization ``scale`` is not positive.

    Args:
        tensors (`dict[str, torch.Tensor]`): The scorer's tensors by name (as in its file).
        what (`str`): Names the scorer in the message (e.g. ``"novelty scorer '/x.safetensors'"``).

    Raises:
        NoveltyScorerError: naming each bad tensor and how many of its values are bad.
    """
    bad = []
    for key in sorted(tensors):
        value = tensors[key]
        if value.is_floating_point() or value.is_complex():
            count = int((~torch.isfinite(value)).sum())
            if count:
                bad.append(f"{key!r} ({count} of {value.numel()} values NaN or Inf)")
    if bad:
        raise NoveltyScorerError(f"{what} holds non-finite values in {', '.join(bad)}: it would score NaN, which no "
                                 "threshold flags")
    scale = tensors.get("scale")
    if scale is not None and scale.is_floating_point() and bool((scale <= 0).any()):
        raise NoveltyScorerError(f"{what}: 'scale' must be > 0 in every dimension, got "
                                 f"{int((scale <= 0).sum())} value(s) <= 0 (min {float(scale.min())!r})")


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file (``calibrate`` records it; the node checks the scorer it loads is the one calibrated)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _int(metadata: dict[str, str], key: str, path: str) -> int:
    try:
        return int(metadata[key])
    except (KeyError, ValueError):
        raise NoveltyScorerError(f"novelty scorer {path!r}: metadata {key!r} missing or not an int "
                                 f"({metadata.get(key)!r})") from None


def load_scorer(path: str | Path) -> NoveltyScorer:
    """Read a scorer written by :meth:`NoveltyScorer.save` (safetensors only, never pickle).

    Raises:
        NoveltyScorerError: not a ``.safetensors`` file, unreadable, not a scorer file, inconsistent tensors, or a
            tensor holding NaN or Inf (named).
    """
    from safetensors import SafetensorError, safe_open

    name = str(path)
    if Path(name).suffix != SUFFIX:
        raise NoveltyScorerError(f"novelty scorer {name!r}: only {SUFFIX} files are read (pickle never is)")
    try:
        with safe_open(name, framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except (OSError, SafetensorError, ValueError) as error:
        raise NoveltyScorerError(f"novelty scorer {name!r} cannot be read: {type(error).__name__}: {error}") from None
    # A NaN anywhere scores NaN on every frame, and NaN compares as "not above the threshold": the alarm would fail
    # open. Refused here, with the tensor named, rather than discovered at run time.
    check_finite_tensors(tensors, f"novelty scorer {name!r}")
    if metadata.get("format") != FILE_FORMAT or metadata.get("version") != FILE_VERSION:
        raise NoveltyScorerError(f"novelty scorer {name!r} is not a {FILE_FORMAT} v{FILE_VERSION} file (metadata "
                                 f"format={metadata.get('format')!r}, version={metadata.get('version')!r})")
    embedding = EmbeddingSpec(metadata.get("embedding", ""), _int(metadata, "grid", name), _int(metadata, "dim", name))
    try:
        mean, scale = tensors["mean"], tensors["scale"]
        kind = metadata.get("kind")
        if kind == "knn":
            return KNNScorer(embedding, mean, scale, tensors["reference"], k=_int(metadata, "k", name))
        if kind == "rnd":
            hidden, out = _int(metadata, "hidden", name), _int(metadata, "out", name)
            nets = []
            for prefix in ("target", "predictor"):
                net = _mlp(embedding.dim, hidden, out)
                net.load_state_dict({k[len(prefix) + 1:]: v for k, v in tensors.items()
                                     if k.startswith(prefix + ".")})
                nets.append(net)
            return RNDScorer(embedding, mean, scale, *nets)
    except (KeyError, RuntimeError) as error:
        raise NoveltyScorerError(f"novelty scorer {name!r} has missing or misshapen tensors: {error}") from None
    raise NoveltyScorerError(f"novelty scorer {name!r}: kind {metadata.get('kind')!r} is not one of "
                             f"{list(SCORER_KINDS)}")

