"""Operating a deployment: telemetry and health, the command line's defaults, retention and archives."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, Field


class OperationSettings(BaseModel):
    # --- telemetry -------------------------------------------------------------------
    otel_exporter_otlp_endpoint: str | None = Field(
        None, validation_alias=AliasChoices("LW_OTEL_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    health_port: int | None = Field(
        None, ge=0, le=65535, description="serve /livez and /readyz on this port (probes; shared/health.py); unset: off"
    )
    health_host: str = Field("127.0.0.1", description="where the health endpoint listens (0.0.0.0 in containers)")
    metrics_poll_s: float = Field(
        15.0,
        ge=0.2,
        le=3600,
        description="how often a service asks JetStream for its consumers' backlog and its streams' store "
        "(/metrics reads the last answer; docs/observability.md)",
    )
    op_counts_dir: str | None = Field(
        None,
        description="benchmarks: on SIGUSR1 a service writes how many NATS operations of each kind it made "
        "(shared/opcounts.py) to <dir>/<service>-<pid>.json; unset: the signal is not handled",
    )

    # --- the command line (loopwarden) ---------------------------------------------------------
    state_dir: str | None = Field(
        None,
        description="where `loopwarden up` records the running stack and the demo keeps its logs (the same from "
        "any folder); default $XDG_STATE_HOME/loopwarden, else ~/.local/state/loopwarden",
    )
    cli_connect_timeout_s: float = Field(
        3.0, gt=0, description="how long a CLI command tries to reach NATS before it says so and exits 3"
    )

    # --- run records: retention and archive (issue 15) -----------------------------------
    retention_runs_s: float = Field(
        7 * 24 * 3600.0,
        ge=0,
        description="a finished run's records (state, events, model calls, ledger, verdicts, ...) are purged this "
        "long after it finished; a running run or one waiting on a human never expires",
    )
    retention_escalations_s: float = Field(
        30 * 24 * 3600.0, ge=0, description="resolved queue items and their events (the audit trail) are kept this long"
    )
    retention_sweep_s: float = Field(300.0, gt=0, description="how often `loopwarden retention` sweeps")
    evt_max_age_s: float = Field(
        0.0, ge=0, description="age limit of the event stream; 0 = none (finished runs' events leave by retention)"
    )
    archive_dir: str | None = Field(None, description="export every finished run to <dir>/<run>.json before it expires")
    archive_bucket: str | None = Field(
        None, description="export every finished run to this Object Store bucket before it expires"
    )
