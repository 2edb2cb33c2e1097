"""The gRPC messages' stub (``strategyjob_ps_pb2.pyi``, what mypy reads) says what protoc built
from ``strategyjob_ps.proto``: the same messages, fields and field types, so a field added to the
.proto without the stub fails here rather than type-checking against stale names."""

from __future__ import annotations

import ast
from pathlib import Path

from google.protobuf.descriptor import FieldDescriptor
from strategyjob.ps import strategyjob_ps_pb2 as pb

STUB = Path(pb.__file__).with_suffix(".pyi")

_SCALARS = {
    FieldDescriptor.TYPE_STRING: "str",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_INT64: "int",
    FieldDescriptor.TYPE_BOOL: "bool",
}


def _expected(field: FieldDescriptor) -> str:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        item = field.message_type.name
    else:
        item = _SCALARS[field.type]
    return f"MutableSequence[{item}]" if field.is_repeated else item


def _stub_messages() -> dict[str, list[tuple[str, str]]]:
    tree = ast.parse(STUB.read_text())
    return {
        node.name: [
            (item.target.id, ast.unparse(item.annotation))
            for item in node.body
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
        ]
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }


def test_the_stub_declares_every_message_with_its_fields_and_types():
    built = {
        name: [(field.name, _expected(field)) for field in message.fields]
        for name, message in pb.DESCRIPTOR.message_types_by_name.items()
    }
    assert _stub_messages() == built


def test_the_stub_classes_are_the_run_time_messages():
    for name in _stub_messages():
        assert getattr(pb, name).DESCRIPTOR.full_name == f"strategyjob.ps.{name}"
