from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Request(_message.Message):
    __slots__ = ("symbols", "timeseries")
    SYMBOLS_FIELD_NUMBER: _ClassVar[int]
    TIMESERIES_FIELD_NUMBER: _ClassVar[int]
    symbols: _containers.RepeatedScalarFieldContainer[str]
    timeseries: _containers.RepeatedCompositeFieldContainer[TimeSeries]
    def __init__(self, symbols: _Optional[_Iterable[str]] = ..., timeseries: _Optional[_Iterable[_Union[TimeSeries, _Mapping]]] = ...) -> None: ...

class TimeSeries(_message.Message):
    __slots__ = ("labels_refs", "samples", "histograms", "exemplars", "metadata", "created_timestamp")
    LABELS_REFS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAMS_FIELD_NUMBER: _ClassVar[int]
    EXEMPLARS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CREATED_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    labels_refs: _containers.RepeatedScalarFieldContainer[int]
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    histograms: _containers.RepeatedScalarFieldContainer[bytes]
    exemplars: _containers.RepeatedScalarFieldContainer[bytes]
    metadata: Metadata
    created_timestamp: int
    def __init__(self, labels_refs: _Optional[_Iterable[int]] = ..., samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., histograms: _Optional[_Iterable[bytes]] = ..., exemplars: _Optional[_Iterable[bytes]] = ..., metadata: _Optional[_Union[Metadata, _Mapping]] = ..., created_timestamp: _Optional[int] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("value", "timestamp", "start_timestamp")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    START_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    value: float
    timestamp: int
    start_timestamp: int
    def __init__(self, value: _Optional[float] = ..., timestamp: _Optional[int] = ..., start_timestamp: _Optional[int] = ...) -> None: ...

class Metadata(_message.Message):
    __slots__ = ("type", "help_ref", "unit_ref")
    class MetricType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        METRIC_TYPE_UNSPECIFIED: _ClassVar[Metadata.MetricType]
        METRIC_TYPE_COUNTER: _ClassVar[Metadata.MetricType]
        METRIC_TYPE_GAUGE: _ClassVar[Metadata.MetricType]
        METRIC_TYPE_HISTOGRAM: _ClassVar[Metadata.MetricType]
        METRIC_TYPE_GAUGEHISTOGRAM: _ClassVar[Metadata.MetricType]
        METRIC_TYPE_SUMMARY: _ClassVar[Metadata.MetricType]
        METRIC_TYPE_INFO: _ClassVar[Metadata.MetricType]
        METRIC_TYPE_STATESET: _ClassVar[Metadata.MetricType]
    METRIC_TYPE_UNSPECIFIED: Metadata.MetricType
    METRIC_TYPE_COUNTER: Metadata.MetricType
    METRIC_TYPE_GAUGE: Metadata.MetricType
    METRIC_TYPE_HISTOGRAM: Metadata.MetricType
    METRIC_TYPE_GAUGEHISTOGRAM: Metadata.MetricType
    METRIC_TYPE_SUMMARY: Metadata.MetricType
    METRIC_TYPE_INFO: Metadata.MetricType
    METRIC_TYPE_STATESET: Metadata.MetricType
    TYPE_FIELD_NUMBER: _ClassVar[int]
    HELP_REF_FIELD_NUMBER: _ClassVar[int]
    UNIT_REF_FIELD_NUMBER: _ClassVar[int]
    type: Metadata.MetricType
    help_ref: int
    unit_ref: int
    def __init__(self, type: _Optional[_Union[Metadata.MetricType, str]] = ..., help_ref: _Optional[int] = ..., unit_ref: _Optional[int] = ...) -> None: ...
