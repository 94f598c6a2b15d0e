"""What a raftq DataFrame looks like, read and written (docs/spark.md)."""

from pyspark.sql.types import (ArrayType, BinaryType, ByteType, IntegerType, LongType, MapType, ShortType,
                               StringType, StructField, StructType, TimestampType)

from .options import OptionError

READ_SCHEMA = StructType([
    StructField("seq", LongType(), False),
    StructField("key", StringType(), True),
    StructField("body", BinaryType(), True),
    StructField("body_json", StringType(), True),
    StructField("headers", MapType(StringType(), StringType()), True),
    StructField("put_at", TimestampType(), False),
    StructField("queue", StringType(), False),
])

INTEGERS = (ByteType, ShortType, IntegerType, LongType)
# column -> (accepted types, what to call them in an error)
WRITE_COLUMNS = {
    "body": ((StringType, BinaryType, StructType, MapType, ArrayType), "string, binary, struct, map or array"),
    "key": ((StringType,), "string"),
    "id": ((StringType,), "string"),
    "headers": ((MapType,), "map<string,string>"),
    "delay_ms": (INTEGERS, "an integer type"),
    "ttl_ms": (INTEGERS, "an integer type"),
}


def check_write_schema(schema: StructType) -> None:
    """Refuse, before anything is written, a DataFrame raftq cannot store as it means."""
    names = [f.name for f in schema.fields]
    if "body" not in names:
        raise OptionError("column body: a DataFrame written to raftq needs a body column "
                          f"(it has {', '.join(names) or 'none'})")
    for field in schema.fields:
        if field.name not in WRITE_COLUMNS:
            raise OptionError(f"column {field.name}: not a raftq message field "
                              f"(allowed: {', '.join(WRITE_COLUMNS)})")
        types, described = WRITE_COLUMNS[field.name]
        data_type = field.dataType
        if not isinstance(data_type, types) or (field.name == "headers" and not (
                isinstance(data_type.keyType, StringType) and isinstance(data_type.valueType, StringType))):
            raise OptionError(f"column {field.name}: must be {described}, not {data_type.simpleString()}")
