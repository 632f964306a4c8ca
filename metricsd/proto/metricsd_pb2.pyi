from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SeriesFn(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERIES_FN_UNSPECIFIED: _ClassVar[SeriesFn]
    SERIES_AVG: _ClassVar[SeriesFn]
    SERIES_MIN: _ClassVar[SeriesFn]
    SERIES_MAX: _ClassVar[SeriesFn]
    SERIES_LAST: _ClassVar[SeriesFn]
    SERIES_SUM: _ClassVar[SeriesFn]
    SERIES_COUNT: _ClassVar[SeriesFn]
    SERIES_RATE: _ClassVar[SeriesFn]
    SERIES_INCREASE: _ClassVar[SeriesFn]

class AcrossFn(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACROSS_FN_UNSPECIFIED: _ClassVar[AcrossFn]
    ACROSS_AVG: _ClassVar[AcrossFn]
    ACROSS_SUM: _ClassVar[AcrossFn]
    ACROSS_MIN: _ClassVar[AcrossFn]
    ACROSS_MAX: _ClassVar[AcrossFn]
    ACROSS_COUNT: _ClassVar[AcrossFn]
    ACROSS_QUANTILE: _ClassVar[AcrossFn]
SERIES_FN_UNSPECIFIED: SeriesFn
SERIES_AVG: SeriesFn
SERIES_MIN: SeriesFn
SERIES_MAX: SeriesFn
SERIES_LAST: SeriesFn
SERIES_SUM: SeriesFn
SERIES_COUNT: SeriesFn
SERIES_RATE: SeriesFn
SERIES_INCREASE: SeriesFn
ACROSS_FN_UNSPECIFIED: AcrossFn
ACROSS_AVG: AcrossFn
ACROSS_SUM: AcrossFn
ACROSS_MIN: AcrossFn
ACROSS_MAX: AcrossFn
ACROSS_COUNT: AcrossFn
ACROSS_QUANTILE: AcrossFn

class Label(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class SeriesLabels(_message.Message):
    __slots__ = ("id", "labels")
    ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    id: int
    labels: _containers.RepeatedCompositeFieldContainer[Label]
    def __init__(self, id: _Optional[int] = ..., labels: _Optional[_Iterable[_Union[Label, _Mapping]]] = ...) -> None: ...

class WriteRequest(_message.Message):
    __slots__ = ("ids", "counts", "timestamps", "values", "series")
    IDS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    counts: _containers.RepeatedScalarFieldContainer[int]
    timestamps: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    series: _containers.RepeatedCompositeFieldContainer[SeriesLabels]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., counts: _Optional[_Iterable[int]] = ..., timestamps: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ..., series: _Optional[_Iterable[_Union[SeriesLabels, _Mapping]]] = ...) -> None: ...

class WriteResponse(_message.Message):
    __slots__ = ("samples_written", "unknown_ids", "rejected_too_old", "rejected_duplicate", "rejected_too_far_ahead", "refused")
    SAMPLES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_IDS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_TOO_OLD_FIELD_NUMBER: _ClassVar[int]
    REJECTED_DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    REJECTED_TOO_FAR_AHEAD_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    samples_written: int
    unknown_ids: _containers.RepeatedScalarFieldContainer[int]
    rejected_too_old: int
    rejected_duplicate: int
    rejected_too_far_ahead: int
    refused: str
    def __init__(self, samples_written: _Optional[int] = ..., unknown_ids: _Optional[_Iterable[int]] = ..., rejected_too_old: _Optional[int] = ..., rejected_duplicate: _Optional[int] = ..., rejected_too_far_ahead: _Optional[int] = ..., refused: _Optional[str] = ...) -> None: ...

class WritePartsRequest(_message.Message):
    __slots__ = ("parts", "timeout_ms")
    PARTS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    parts: _containers.RepeatedCompositeFieldContainer[WriteRequest]
    timeout_ms: int
    def __init__(self, parts: _Optional[_Iterable[_Union[WriteRequest, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class WritePartResult(_message.Message):
    __slots__ = ("code", "message", "response")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    response: WriteResponse
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., response: _Optional[_Union[WriteResponse, _Mapping]] = ...) -> None: ...

class WritePartsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[WritePartResult]
    def __init__(self, results: _Optional[_Iterable[_Union[WritePartResult, _Mapping]]] = ...) -> None: ...

class Matcher(_message.Message):
    __slots__ = ("type", "name", "value")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        EQ: _ClassVar[Matcher.Type]
        NEQ: _ClassVar[Matcher.Type]
        RE: _ClassVar[Matcher.Type]
        NRE: _ClassVar[Matcher.Type]
    EQ: Matcher.Type
    NEQ: Matcher.Type
    RE: Matcher.Type
    NRE: Matcher.Type
    TYPE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    type: Matcher.Type
    name: str
    value: str
    def __init__(self, type: _Optional[_Union[Matcher.Type, str]] = ..., name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class SlotFilter(_message.Message):
    __slots__ = ("slot_count", "slots")
    SLOT_COUNT_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    slot_count: int
    slots: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, slot_count: _Optional[int] = ..., slots: _Optional[_Iterable[int]] = ...) -> None: ...

class MissingCluster(_message.Message):
    __slots__ = ("cluster", "reason")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    reason: str
    def __init__(self, cluster: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("matchers", "start_ms", "end_ms", "slots", "columnar", "max_series", "max_samples")
    MATCHERS_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    COLUMNAR_FIELD_NUMBER: _ClassVar[int]
    MAX_SERIES_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    matchers: _containers.RepeatedCompositeFieldContainer[Matcher]
    start_ms: int
    end_ms: int
    slots: SlotFilter
    columnar: bool
    max_series: int
    max_samples: int
    def __init__(self, matchers: _Optional[_Iterable[_Union[Matcher, _Mapping]]] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., slots: _Optional[_Union[SlotFilter, _Mapping]] = ..., columnar: _Optional[bool] = ..., max_series: _Optional[int] = ..., max_samples: _Optional[int] = ...) -> None: ...

class SeriesData(_message.Message):
    __slots__ = ("id", "labels", "timestamps", "values")
    ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    id: int
    labels: _containers.RepeatedCompositeFieldContainer[Label]
    timestamps: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, id: _Optional[int] = ..., labels: _Optional[_Iterable[_Union[Label, _Mapping]]] = ..., timestamps: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("series", "missing_clusters", "batch")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    MISSING_CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    series: _containers.RepeatedCompositeFieldContainer[SeriesData]
    missing_clusters: _containers.RepeatedCompositeFieldContainer[MissingCluster]
    batch: SeriesBatch
    def __init__(self, series: _Optional[_Iterable[_Union[SeriesData, _Mapping]]] = ..., missing_clusters: _Optional[_Iterable[_Union[MissingCluster, _Mapping]]] = ..., batch: _Optional[_Union[SeriesBatch, _Mapping]] = ...) -> None: ...

class AggregateQuery(_message.Message):
    __slots__ = ("matchers", "series_fn", "window_ms")
    MATCHERS_FIELD_NUMBER: _ClassVar[int]
    SERIES_FN_FIELD_NUMBER: _ClassVar[int]
    WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    matchers: _containers.RepeatedCompositeFieldContainer[Matcher]
    series_fn: SeriesFn
    window_ms: int
    def __init__(self, matchers: _Optional[_Iterable[_Union[Matcher, _Mapping]]] = ..., series_fn: _Optional[_Union[SeriesFn, str]] = ..., window_ms: _Optional[int] = ...) -> None: ...

class AggregateRequest(_message.Message):
    __slots__ = ("query", "denominator", "across", "quantile", "group_by", "start_ms", "end_ms", "step_ms", "per_series", "slots", "slot_digests", "data_slots", "top_k", "bottom_k", "max_series")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    DENOMINATOR_FIELD_NUMBER: _ClassVar[int]
    ACROSS_FIELD_NUMBER: _ClassVar[int]
    QUANTILE_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    STEP_MS_FIELD_NUMBER: _ClassVar[int]
    PER_SERIES_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    SLOT_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    DATA_SLOTS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    BOTTOM_K_FIELD_NUMBER: _ClassVar[int]
    MAX_SERIES_FIELD_NUMBER: _ClassVar[int]
    query: AggregateQuery
    denominator: AggregateQuery
    across: AcrossFn
    quantile: float
    group_by: _containers.RepeatedScalarFieldContainer[str]
    start_ms: int
    end_ms: int
    step_ms: int
    per_series: bool
    slots: SlotFilter
    slot_digests: bool
    data_slots: _containers.RepeatedScalarFieldContainer[int]
    top_k: int
    bottom_k: int
    max_series: int
    def __init__(self, query: _Optional[_Union[AggregateQuery, _Mapping]] = ..., denominator: _Optional[_Union[AggregateQuery, _Mapping]] = ..., across: _Optional[_Union[AcrossFn, str]] = ..., quantile: _Optional[float] = ..., group_by: _Optional[_Iterable[str]] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., step_ms: _Optional[int] = ..., per_series: _Optional[bool] = ..., slots: _Optional[_Union[SlotFilter, _Mapping]] = ..., slot_digests: _Optional[bool] = ..., data_slots: _Optional[_Iterable[int]] = ..., top_k: _Optional[int] = ..., bottom_k: _Optional[int] = ..., max_series: _Optional[int] = ...) -> None: ...

class SlotDigests(_message.Message):
    __slots__ = ("slots", "series", "samples", "hash")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    slots: _containers.RepeatedScalarFieldContainer[int]
    series: _containers.RepeatedScalarFieldContainer[int]
    samples: _containers.RepeatedScalarFieldContainer[int]
    hash: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, slots: _Optional[_Iterable[int]] = ..., series: _Optional[_Iterable[int]] = ..., samples: _Optional[_Iterable[int]] = ..., hash: _Optional[_Iterable[int]] = ...) -> None: ...

class Partials(_message.Message):
    __slots__ = ("sum", "count", "min", "max")
    SUM_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    sum: _containers.RepeatedScalarFieldContainer[float]
    count: _containers.RepeatedScalarFieldContainer[float]
    min: _containers.RepeatedScalarFieldContainer[float]
    max: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, sum: _Optional[_Iterable[float]] = ..., count: _Optional[_Iterable[float]] = ..., min: _Optional[_Iterable[float]] = ..., max: _Optional[_Iterable[float]] = ...) -> None: ...

class SeriesPartials(_message.Message):
    __slots__ = ("ids", "group", "values", "samples")
    IDS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    group: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    samples: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., group: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ..., samples: _Optional[_Iterable[int]] = ...) -> None: ...

class Group(_message.Message):
    __slots__ = ("labels",)
    LABELS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[Label]
    def __init__(self, labels: _Optional[_Iterable[_Union[Label, _Mapping]]] = ...) -> None: ...

class AggregateResponse(_message.Message):
    __slots__ = ("timestamps", "groups", "numerator", "denominator", "values", "numerator_series", "denominator_series", "series_scanned", "samples_scanned", "slot_digests", "missing_clusters")
    TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    NUMERATOR_FIELD_NUMBER: _ClassVar[int]
    DENOMINATOR_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    NUMERATOR_SERIES_FIELD_NUMBER: _ClassVar[int]
    DENOMINATOR_SERIES_FIELD_NUMBER: _ClassVar[int]
    SERIES_SCANNED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_SCANNED_FIELD_NUMBER: _ClassVar[int]
    SLOT_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    MISSING_CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    timestamps: _containers.RepeatedScalarFieldContainer[int]
    groups: _containers.RepeatedCompositeFieldContainer[Group]
    numerator: Partials
    denominator: Partials
    values: _containers.RepeatedScalarFieldContainer[float]
    numerator_series: SeriesPartials
    denominator_series: SeriesPartials
    series_scanned: int
    samples_scanned: int
    slot_digests: SlotDigests
    missing_clusters: _containers.RepeatedCompositeFieldContainer[MissingCluster]
    def __init__(self, timestamps: _Optional[_Iterable[int]] = ..., groups: _Optional[_Iterable[_Union[Group, _Mapping]]] = ..., numerator: _Optional[_Union[Partials, _Mapping]] = ..., denominator: _Optional[_Union[Partials, _Mapping]] = ..., values: _Optional[_Iterable[float]] = ..., numerator_series: _Optional[_Union[SeriesPartials, _Mapping]] = ..., denominator_series: _Optional[_Union[SeriesPartials, _Mapping]] = ..., series_scanned: _Optional[int] = ..., samples_scanned: _Optional[int] = ..., slot_digests: _Optional[_Union[SlotDigests, _Mapping]] = ..., missing_clusters: _Optional[_Iterable[_Union[MissingCluster, _Mapping]]] = ...) -> None: ...

class SeriesRollups(_message.Message):
    __slots__ = ("id", "labels", "hours", "min", "max", "sum", "count", "last")
    ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    HOURS_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    SUM_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    id: int
    labels: _containers.RepeatedCompositeFieldContainer[Label]
    hours: _containers.RepeatedScalarFieldContainer[int]
    min: _containers.RepeatedScalarFieldContainer[float]
    max: _containers.RepeatedScalarFieldContainer[float]
    sum: _containers.RepeatedScalarFieldContainer[float]
    count: _containers.RepeatedScalarFieldContainer[float]
    last: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, id: _Optional[int] = ..., labels: _Optional[_Iterable[_Union[Label, _Mapping]]] = ..., hours: _Optional[_Iterable[int]] = ..., min: _Optional[_Iterable[float]] = ..., max: _Optional[_Iterable[float]] = ..., sum: _Optional[_Iterable[float]] = ..., count: _Optional[_Iterable[float]] = ..., last: _Optional[_Iterable[float]] = ...) -> None: ...

class RollupsResponse(_message.Message):
    __slots__ = ("series", "missing_clusters", "batch")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    MISSING_CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    series: _containers.RepeatedCompositeFieldContainer[SeriesRollups]
    missing_clusters: _containers.RepeatedCompositeFieldContainer[MissingCluster]
    batch: RollupsBatch
    def __init__(self, series: _Optional[_Iterable[_Union[SeriesRollups, _Mapping]]] = ..., missing_clusters: _Optional[_Iterable[_Union[MissingCluster, _Mapping]]] = ..., batch: _Optional[_Union[RollupsBatch, _Mapping]] = ...) -> None: ...

class ListSeriesRequest(_message.Message):
    __slots__ = ("matchers", "limit", "slots", "columnar", "max_series")
    MATCHERS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    COLUMNAR_FIELD_NUMBER: _ClassVar[int]
    MAX_SERIES_FIELD_NUMBER: _ClassVar[int]
    matchers: _containers.RepeatedCompositeFieldContainer[Matcher]
    limit: int
    slots: SlotFilter
    columnar: bool
    max_series: int
    def __init__(self, matchers: _Optional[_Iterable[_Union[Matcher, _Mapping]]] = ..., limit: _Optional[int] = ..., slots: _Optional[_Union[SlotFilter, _Mapping]] = ..., columnar: _Optional[bool] = ..., max_series: _Optional[int] = ...) -> None: ...

class ListSeriesResponse(_message.Message):
    __slots__ = ("series", "missing_clusters", "batch")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    MISSING_CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    series: _containers.RepeatedCompositeFieldContainer[SeriesLabels]
    missing_clusters: _containers.RepeatedCompositeFieldContainer[MissingCluster]
    batch: SeriesBatch
    def __init__(self, series: _Optional[_Iterable[_Union[SeriesLabels, _Mapping]]] = ..., missing_clusters: _Optional[_Iterable[_Union[MissingCluster, _Mapping]]] = ..., batch: _Optional[_Union[SeriesBatch, _Mapping]] = ...) -> None: ...

class LabelValuesRequest(_message.Message):
    __slots__ = ("name", "matchers", "slots")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MATCHERS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    matchers: _containers.RepeatedCompositeFieldContainer[Matcher]
    slots: SlotFilter
    def __init__(self, name: _Optional[str] = ..., matchers: _Optional[_Iterable[_Union[Matcher, _Mapping]]] = ..., slots: _Optional[_Union[SlotFilter, _Mapping]] = ...) -> None: ...

class LabelValuesResponse(_message.Message):
    __slots__ = ("values", "missing_clusters")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    MISSING_CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    missing_clusters: _containers.RepeatedCompositeFieldContainer[MissingCluster]
    def __init__(self, values: _Optional[_Iterable[str]] = ..., missing_clusters: _Optional[_Iterable[_Union[MissingCluster, _Mapping]]] = ...) -> None: ...

class CatchUpRequest(_message.Message):
    __slots__ = ("slots", "start_ms", "end_ms", "resume_token", "max_samples_per_page")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLES_PER_PAGE_FIELD_NUMBER: _ClassVar[int]
    slots: SlotFilter
    start_ms: int
    end_ms: int
    resume_token: bytes
    max_samples_per_page: int
    def __init__(self, slots: _Optional[_Union[SlotFilter, _Mapping]] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., resume_token: _Optional[bytes] = ..., max_samples_per_page: _Optional[int] = ...) -> None: ...

class CatchUpPage(_message.Message):
    __slots__ = ("batch", "resume_token")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    batch: WriteRequest
    resume_token: bytes
    def __init__(self, batch: _Optional[_Union[WriteRequest, _Mapping]] = ..., resume_token: _Optional[bytes] = ...) -> None: ...

class DigestRequest(_message.Message):
    __slots__ = ("slots", "start_ms", "end_ms", "bucket_ms", "per_series", "cover_chunks")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_MS_FIELD_NUMBER: _ClassVar[int]
    PER_SERIES_FIELD_NUMBER: _ClassVar[int]
    COVER_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    slots: SlotFilter
    start_ms: int
    end_ms: int
    bucket_ms: int
    per_series: bool
    cover_chunks: bool
    def __init__(self, slots: _Optional[_Union[SlotFilter, _Mapping]] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., bucket_ms: _Optional[int] = ..., per_series: _Optional[bool] = ..., cover_chunks: _Optional[bool] = ...) -> None: ...

class SlotDigest(_message.Message):
    __slots__ = ("slot", "series", "samples", "hash")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    slot: int
    series: int
    samples: int
    hash: int
    def __init__(self, slot: _Optional[int] = ..., series: _Optional[int] = ..., samples: _Optional[int] = ..., hash: _Optional[int] = ...) -> None: ...

class SeriesDigest(_message.Message):
    __slots__ = ("id", "slot", "samples", "hash", "bucket_hashes")
    ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    BUCKET_HASHES_FIELD_NUMBER: _ClassVar[int]
    id: int
    slot: int
    samples: int
    hash: int
    bucket_hashes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, id: _Optional[int] = ..., slot: _Optional[int] = ..., samples: _Optional[int] = ..., hash: _Optional[int] = ..., bucket_hashes: _Optional[_Iterable[int]] = ...) -> None: ...

class DigestResponse(_message.Message):
    __slots__ = ("slots", "series")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    slots: _containers.RepeatedCompositeFieldContainer[SlotDigest]
    series: _containers.RepeatedCompositeFieldContainer[SeriesDigest]
    def __init__(self, slots: _Optional[_Iterable[_Union[SlotDigest, _Mapping]]] = ..., series: _Optional[_Iterable[_Union[SeriesDigest, _Mapping]]] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("status", "member", "version", "read_port")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[HealthResponse.Status]
        SERVING: _ClassVar[HealthResponse.Status]
        CATCHING_UP: _ClassVar[HealthResponse.Status]
        NOT_SERVING: _ClassVar[HealthResponse.Status]
    UNKNOWN: HealthResponse.Status
    SERVING: HealthResponse.Status
    CATCHING_UP: HealthResponse.Status
    NOT_SERVING: HealthResponse.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    READ_PORT_FIELD_NUMBER: _ClassVar[int]
    status: HealthResponse.Status
    member: str
    version: str
    read_port: int
    def __init__(self, status: _Optional[_Union[HealthResponse.Status, str]] = ..., member: _Optional[str] = ..., version: _Optional[str] = ..., read_port: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("series", "samples", "chunk_bytes", "chunk_samples", "bytes_per_sample", "head_samples", "pods", "rejected", "rollup_buckets")
    class RejectedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SERIES_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    HEAD_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    ROLLUP_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    series: int
    samples: int
    chunk_bytes: int
    chunk_samples: int
    bytes_per_sample: float
    head_samples: int
    pods: int
    rejected: _containers.ScalarMap[str, int]
    rollup_buckets: int
    def __init__(self, series: _Optional[int] = ..., samples: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., chunk_samples: _Optional[int] = ..., bytes_per_sample: _Optional[float] = ..., head_samples: _Optional[int] = ..., pods: _Optional[int] = ..., rejected: _Optional[_Mapping[str, int]] = ..., rollup_buckets: _Optional[int] = ...) -> None: ...

class LabelColumn(_message.Message):
    __slots__ = ("name", "values", "codes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    CODES_FIELD_NUMBER: _ClassVar[int]
    name: str
    values: _containers.RepeatedScalarFieldContainer[str]
    codes: bytes
    def __init__(self, name: _Optional[str] = ..., values: _Optional[_Iterable[str]] = ..., codes: _Optional[bytes] = ...) -> None: ...

class SeriesBatch(_message.Message):
    __slots__ = ("ids", "labels", "counts", "timestamps", "values")
    IDS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    ids: bytes
    labels: _containers.RepeatedCompositeFieldContainer[LabelColumn]
    counts: bytes
    timestamps: bytes
    values: bytes
    def __init__(self, ids: _Optional[bytes] = ..., labels: _Optional[_Iterable[_Union[LabelColumn, _Mapping]]] = ..., counts: _Optional[bytes] = ..., timestamps: _Optional[bytes] = ..., values: _Optional[bytes] = ...) -> None: ...

class RollupsBatch(_message.Message):
    __slots__ = ("series", "max", "sum", "count", "last")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    SUM_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    series: SeriesBatch
    max: bytes
    sum: bytes
    count: bytes
    last: bytes
    def __init__(self, series: _Optional[_Union[SeriesBatch, _Mapping]] = ..., max: _Optional[bytes] = ..., sum: _Optional[bytes] = ..., count: _Optional[bytes] = ..., last: _Optional[bytes] = ...) -> None: ...
