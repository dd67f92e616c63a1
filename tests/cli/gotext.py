"""How the Pulumi CLI reads YAML and writes config values as text: Go's YAML (gopkg.in/yaml.v3)
and Go's JSON, not Python's. Sources:

- gopkg.in/yaml.v3 `resolve.go` `resolve` (go-yaml/yaml, branch v3, f6f7691b): a plain scalar is
  null only as ``, `~`, `null`, `Null`, `NULL`; a bool only as `true`/`True`/`TRUE` and the
  three `false`s (`yes`, `on`, `no`, `off` are strings); an int as Go's `strconv.ParseInt(s, 0,
  64)` reads it with `_` removed (`0x1F`, `0o17`, `017` octal, `0b101`), else `ParseUint`; a float
  when it matches `yamlStyleFloat` (so `1e16` is a float, which YAML 1.1 readers such as PyYAML
  keep as a string) or starts with `.` (`.5`, `.inf`, `.nan`); a timestamp when it starts with
  `YYYY-`. Quoted scalars stay strings.
- pulumi/pulumi v3.259 `sdk/go/common/resource/config/object.go` `unmarshalObject`,
  `MarshalString`, `marshalObjectValue`: a scalar number or bool is stored as its Go JSON text
  (`1.0` -> `1`, `1e16` -> `10000000000000000`); a map or list as compact JSON (Go's
  `json.Marshal`: keys sorted, `<`, `>`, `&` escaped); map keys as `fmt.Sprintf("%v", key)`;
  `{secure: ...}` anywhere is a secret (`isSecureValue`), kept as `{"secure": ...}` inside an
  object, and the whole key is secure when any part is (`object.Secure`).
- Go's `encoding/json` `floatEncoder`: `strconv.AppendFloat(f, 'f', -1)`, or `'e'` below 1e-6 and
  from 1e21 on, with `e-09` cleaned to `e-9`.

A timestamp (`time.Time` in Go, which the CLI stores as `t.String()`) is refused here with a
message: the tests' configs hold none, and Go's time formatting is not emulated.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

import yaml

GO_YAML_TAG = "tag:spark-vllm.test,2026:go-scalar"
_NULLS = frozenset({"", "~", "null", "Null", "NULL"})
_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_SPECIAL_FLOATS = {
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
}
_YAML_STYLE_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
# strconv.ParseInt(s, 0, 64): a sign, then a base prefix (0x, 0o, 0b, or a leading 0: octal).
_GO_INT = re.compile(r"^([-+]?)(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)$")
_GO_FLOAT = re.compile(r"^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$")
_TIMESTAMP_START = re.compile(r"^[0-9]{4}-")
INT64 = (-(1 << 63), (1 << 63) - 1)


class GoTextError(ValueError):
    """A value this emulation does not cover (it refuses rather than guess)."""


def _go_int(plain: str) -> int | None:
    """strconv.ParseInt(plain, 0, 64), else ParseUint(plain, 0, 64); None when neither parses."""
    match = _GO_INT.match(plain)
    if match is None:
        return None
    sign, digits = match.groups()
    if digits[:2].lower() in ("0x", "0o", "0b"):
        value = int(digits[2:], {"x": 16, "o": 8, "b": 2}[digits[1].lower()])
    elif len(digits) > 1 and digits[0] == "0":
        value = int(digits, 8)
    else:
        value = int(digits)
    value = -value if sign == "-" else value
    if INT64[0] <= value <= INT64[1] or (sign == "" and value < 1 << 64):
        return value
    return None


def resolve(text: str) -> Any:
    """yaml.v3's `resolve` of a plain scalar, decoded into `any`."""
    if text in _NULLS:
        return None
    if text in _BOOLS:
        return _BOOLS[text]
    if text in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[text]
    hint = text[0]
    if hint == ".":
        return float(text) if _GO_FLOAT.match(text) else text
    if hint in "+-0123456789":
        if _TIMESTAMP_START.match(text):
            raise GoTextError(
                f"YAML timestamp {text!r}: Go's time formatting is not emulated; quote it"
            )
        plain = text.replace("_", "")
        number = _go_int(plain)
        if number is not None:
            return number
        if _YAML_STYLE_FLOAT.match(plain):
            return float(plain)
    return text


class GoYamlLoader(yaml.SafeLoader):
    """PyYAML with yaml.v3's scalar resolution: every plain scalar goes through `resolve`; map
    keys become the text Go gives them (in Go `1` and `true` are two keys, in a Python dict
    one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)
        mapping: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = key_text(self.construct_object(key_node, deep=deep))
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping


GoYamlLoader.yaml_implicit_resolvers = {}
GoYamlLoader.add_implicit_resolver(GO_YAML_TAG, re.compile(r".*", re.DOTALL), None)
GoYamlLoader.add_constructor(
    GO_YAML_TAG,
    lambda loader, node: resolve(loader.construct_scalar(node)),  # type: ignore[arg-type]
)


def load(text: str) -> Any:
    """A YAML document as the CLI decodes it (into Go's `any`)."""
    return yaml.load(text, Loader=GoYamlLoader)


def float_text(value: float) -> str:
    """Go's encoding/json text of a float64."""
    if math.isnan(value) or math.isinf(value):
        # encoding/json's UnsupportedValueError, the float as strconv.FormatFloat(f, 'g', -1).
        shown = "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
        raise GoTextError(f"json: unsupported value: {shown}")
    if value == 0:
        return "-0" if math.copysign(1, value) < 0 else "0"
    if abs(value) < 1e-6 or abs(value) >= 1e21:
        # repr: the shortest round trip, as AppendFloat(-1), in e-notation at these sizes, with
        # Go's two-digit exponent (1e+21, 1.5e-07); then Go's clean-up of e-0N to e-N.
        return re.sub(r"e-0([0-9])$", r"e-\1", repr(value))
    text = format(Decimal(repr(value)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def scalar_text(value: Any) -> str:
    """A non-object value as the stack stores it (`MarshalString`)."""
    if value is None:
        return ""  # loaders.go: a null value is treated as "" (with a warning)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return float_text(value)
    return str(value)


def key_text(key: Any) -> str:
    """A map key as `fmt.Sprintf("%v", key)` prints it."""
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int | str):
        return str(key)
    if key is None:
        return "<nil>"
    raise GoTextError(f"map key {key!r}: Go's %v of a {type(key).__name__} is not emulated")


def json_text(value: Any) -> str:
    """Go's json.Marshal: compact, map keys sorted, HTML characters escaped, floats as Go's."""
    if isinstance(value, dict):
        items = sorted(value.items())
        return "{" + ",".join(f"{_string(k)}:{json_text(v)}" for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(json_text(item) for item in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, str):
        return _string(value)
    return scalar_text(value)


def _string(text: str) -> str:
    """Go's encodeState.string with escapeHTML (the default of json.Marshal)."""
    encoded = json.dumps(text, ensure_ascii=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        encoded = encoded.replace(char, escape)
    return encoded.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
