# The types of strategyjob_ps_pb2 (protoc builds its message classes at run time, from
# strategyjob_ps.proto, where the fields are documented). Keep in step with the .proto; protoc's
# --pyi_out writes the same classes with their constructors too.
from collections.abc import MutableSequence
from typing import Any

from google.protobuf.message import Message

DESCRIPTOR: Any

class Tensor(Message):
    dtype: str
    shape: MutableSequence[int]
    data: bytes

class VarOp(Message):
    op: str
    name: str
    value: Tensor
    indices: Tensor
    optimizer: str
    read_back: bool

class VarOps(Message):
    ops: MutableSequence[VarOp]
    update_id: str
    raw: bytes

class VarResults(Message):
    values: MutableSequence[Tensor]
    raw: bytes

class Closure(Message):
    payload: bytes
    tensors: MutableSequence[Tensor]
    function_digest: str
    function: bytes
    function_tensors: MutableSequence[Tensor]
    resource_id: int
    step_id: str

class ClosureResult(Message):
    payload: bytes
    tensors: MutableSequence[Tensor]
    error_kind: str
    error_message: str
    error: bytes
    ps_task: str

class Ping(Message): ...

class Status(Message):
    job_name: str
    task_index: int
    incarnation: str
