"""Protobuf message classes built at run time from descriptors (no protoc here), as generated
`_pb2` modules would give them: `Order` (in orders.proto, importing money.proto and the
well-known timestamp.proto) and `Money` (money.proto)."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

_FIELD = descriptor_pb2.FieldDescriptorProto

POOL = descriptor_pool.DescriptorPool()
POOL.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)


def _file(name: str, package: str, dependencies: list[str]) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name=name, package=package, syntax="proto3")
    proto.dependency.extend(dependencies)
    return proto


def _field(message: Any, name: str, number: int, kind: int, type_name: str = "") -> None:
    field = message.field.add(name=name, number=number, type=kind, label=_FIELD.LABEL_OPTIONAL)
    if type_name:
        field.type_name = type_name


money = _file("money.proto", "shop", [])
_money = money.message_type.add(name="Money")
_field(_money, "currency", 1, _FIELD.TYPE_STRING)
_field(_money, "units", 2, _FIELD.TYPE_INT64)

orders = _file("orders.proto", "shop", ["money.proto", "google/protobuf/timestamp.proto"])
_header = orders.message_type.add(name="Header")  # index 0: Order is index [1]
_field(_header, "source", 1, _FIELD.TYPE_STRING)
_order = orders.message_type.add(name="Order")
_field(_order, "id", 1, _FIELD.TYPE_STRING)
_field(_order, "amount", 2, _FIELD.TYPE_MESSAGE, ".shop.Money")
_field(_order, "placed", 3, _FIELD.TYPE_MESSAGE, ".google.protobuf.Timestamp")
_line = _order.nested_type.add(name="Line")  # Order.Line is index [1, 0]
_field(_line, "sku", 1, _FIELD.TYPE_STRING)
_field(_line, "quantity", 2, _FIELD.TYPE_INT32)

POOL.Add(money)
POOL.Add(orders)

Money: Any = message_factory.GetMessageClass(POOL.FindMessageTypeByName("shop.Money"))
Header: Any = message_factory.GetMessageClass(POOL.FindMessageTypeByName("shop.Header"))
Order: Any = message_factory.GetMessageClass(POOL.FindMessageTypeByName("shop.Order"))
OrderLine: Any = message_factory.GetMessageClass(POOL.FindMessageTypeByName("shop.Order.Line"))
