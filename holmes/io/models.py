"""Pydantic models of the small JSON files at the edges of a job: ``job.json`` and ``truth.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from holmes.errors import JobError

__all__ = ["CommunicatorModel", "ParallelModel", "SourceInfo", "JobMeta", "FaultTruth", "TruthModel",
           "load_model", "format_validation_error"]

KindLiteral = Literal["dp", "tp", "pp", "ep", "cp", "other"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class CommunicatorModel(_Strict):
    kind: KindLiteral
    ranks: list[int] = Field(min_length=1)
    name: str | None = None  # e.g. the framework's process-group description


class ParallelModel(_Strict):
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    cp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    etp: int | None = Field(None, ge=1)
    order: str = "tp-cp-ep-dp-pp"


class SourceInfo(_Strict):
    """Where a job came from: the converter, what it inferred and what it had to guess."""

    format: str
    path: str | None = None
    inferred: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)


class DumpInfo(_Strict):
    """Why and when logs holding in-flight ops were written (``job.json``'s optional ``dump``)."""

    reason: Literal["timeout", "signal", "exception", "end"]
    at_ns: int | None = None
    detail: str | None = None  # e.g. the signal's name or the exception's one-line text


class JobMeta(_Strict):
    """The contents of ``job.json``."""

    schema_id: Literal["holmes.commops/1"] = Field("holmes.commops/1", alias="schema")
    world_size: int = Field(ge=1)
    parallel: ParallelModel | None = None
    communicators: dict[str, CommunicatorModel] | None = None
    gpus_per_host: int | None = Field(None, ge=1)
    name: str | None = None
    source: SourceInfo | None = None
    dump: DumpInfo | None = None
    extra: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> "JobMeta":
        from holmes.limits import max_world_size

        cap = max_world_size()
        if self.world_size > cap:
            raise ValueError(f"world_size {self.world_size} exceeds the cap of {cap} ranks "
                             "(raise HOLMES_MAX_WORLD_SIZE for a larger job; see docs/limits.md)")
        if self.parallel is None and self.communicators is None:
            raise ValueError("job.json needs 'communicators' or 'parallel' (or both)")
        if self.communicators:
            for cid, c in self.communicators.items():
                bad = [r for r in c.ranks if r < 0 or r >= self.world_size]
                if bad:
                    raise ValueError(f"communicator '{cid}' lists rank {bad[0]} outside world_size {self.world_size}")
        return self

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, exclude_defaults=False, mode="json")


class FaultTruth(_Strict):
    device: str
    pattern: Literal["spike", "fluctuation", "persistent"]
    factor: float
    iterations: list[int] = Field(default_factory=list)


class TruthModel(_Strict):
    """The contents of ``truth.json`` in generated or labelled jobs."""

    schema_id: Literal["holmes.truth/1"] = Field("holmes.truth/1", alias="schema")
    faults: list[FaultTruth] = Field(default_factory=list)
    devices: list[str] = Field(default_factory=list)
    abnormal_margin: float | None = None
    drift_per_iteration: float | None = None
    seed: int | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


def format_validation_error(exc: ValidationError) -> str:
    """One line naming each offending key of a pydantic validation error."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ())) or "(top level)"
        msg = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden":
            msg = "unknown key"
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def load_model(path: Path, model: type[BaseModel], error: type[Exception] = JobError) -> Any:
    """Parse a JSON file into ``model``, raising ``error`` that names the file and the bad keys."""
    from holmes.limits import read_json_capped

    data = read_json_capped(path, error=error, what=path.name)
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(f"{path}: {format_validation_error(exc)}") from None
    except RecursionError:
        raise error(f"{path}: nested too deeply") from None
