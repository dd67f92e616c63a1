"""A body whose `model` the front and vLLM could read differently, refused before it is routed.

With several models the front routes (and checks a key's models) by the body's `model`, read
by HAProxy's json_query: the FIRST top-level key spelled exactly `"model"`, and only when its
value is a string, a number or a boolean. vLLM reads the body with Python's json: the LAST key
whose decoded name is `model` (`"mod\\u0065l"` is one), whatever its value. So a body such as
`{"model": "beta", "model": "alpha"}`, `{"mod\\u0065l": "alpha", "model": "beta"}` or
`{"model": null, "model": "alpha"}` could be checked and routed as one model and served as
another: a key limited to some models could reach an adapter or a name the front never allowed.

The front refuses (400, in vLLM's error shape) a JSON object whose top level has `model` more
than once, a `model` key written with escapes, or a `model` that is not a string; nested
objects (a tool's schema with a `model` property) are not looked at, as neither reader does.
HAProxy cannot count keys itself, so a Lua sample fetch of a few lines reads the top level of
the body the front already holds (Lua is built into Debian's HAProxy and the official images).
It is not a JSON validator: a body that is not an object, or is malformed, is left to vLLM
(which refuses it), since json_query reads no `model` from it either. Only the part of the
body the front reads is looked at (front.BODY_BUFFER_BYTES): a second `model` past it cannot
be seen (docs/security.md)."""

from __future__ import annotations

from dataclasses import dataclass

BODY_LUA_NAME = "body.lua"
MODEL_CHECK_FETCH = "model_check"  # `lua.model_check`: one of BODY_REFUSALS' codes, or ""


@dataclass(frozen=True)
class BodyRefusal:
    """What the front answers (400) for a body the Lua check names by `code`."""

    code: str
    message: str


# In the order the check reports them when a body has several (the first that applies).
BODY_REFUSALS: tuple[BodyRefusal, ...] = (
    BodyRefusal(
        "duplicate",
        "The body names `model` more than once; the front and vLLM would read different "
        "ones: send `model` once.",
    ),
    BodyRefusal(
        "escaped",
        'The body\'s `model` key is written with escapes (such as \\u0065): write it as "model".',
    ),
    BodyRefusal("not_string", "`model` must be a string naming a served model."),
)

BODY_LUA = """\
-- Written by spark-vllm (stacks/plan/front_body.py): refuses a body whose `model` the front
-- (HAProxy's json_query: the first key spelled "model") and vLLM (Python's json: the last key
-- whose decoded name is model) could read differently. Reads the top level of a JSON object.
local function skip_ws(s, i)
  return (s:find("[^ \\t\\r\\n]", i))
end

-- s:byte(i) is a string's opening quote: the index after its closing quote and whether it
-- holds an escape, or nil when the body ends first.
local function skip_string(s, i)
  local j, escaped = i + 1, false
  while true do
    local k = s:find('["\\\\]', j)
    if not k then return nil end
    if s:byte(k) == 34 then return k + 1, escaped end
    escaped = true
    j = k + 2
  end
end

local simple = {b = "\\b", f = "\\f", n = "\\n", r = "\\r", t = "\\t"}

-- A key's name as JSON decodes it (code points past ASCII as "?": they are not in "model").
local function decode(raw)
  local out, i = {}, 1
  while i <= #raw do
    local c = raw:sub(i, i)
    if c ~= "\\\\" then
      out[#out + 1] = c
      i = i + 1
    else
      local e = raw:sub(i + 1, i + 1)
      if e == "u" then
        local code = tonumber(raw:sub(i + 2, i + 5), 16) or 0xFFFF
        out[#out + 1] = code < 128 and string.char(code) or "?"
        i = i + 6
      else
        out[#out + 1] = simple[e] or e
        i = i + 2
      end
    end
  end
  return table.concat(out)
end

-- The index after the value that starts at i, or nil when the body ends first.
local function skip_value(s, i)
  local c = s:byte(i)
  if c == 34 then return (skip_string(s, i)) end
  if c == 123 or c == 91 then
    local depth, j = 0, i
    while true do
      local k = s:find('[{}%[%]"]', j)
      if not k then return nil end
      local b = s:byte(k)
      if b == 34 then
        j = skip_string(s, k)
        if not j then return nil end
      else
        depth = depth + ((b == 123 or b == 91) and 1 or -1)
        j = k + 1
        if depth == 0 then return j end
      end
    end
  end
  return (s:find("[,}%]%s]", i))
end

local function check(body)
  local i = skip_ws(body, 1)
  if not i or body:byte(i) ~= 123 then return "" end
  i = skip_ws(body, i + 1)
  local seen, escaped_key, not_string = 0, false, false
  while i and body:byte(i) == 34 do
    local after, escaped = skip_string(body, i)
    if not after then break end
    local name = body:sub(i + 1, after - 2)
    local is_model = name == "model" or (escaped and decode(name) == "model")
    i = skip_ws(body, after)
    if not i or body:byte(i) ~= 58 then break end
    i = skip_ws(body, i + 1)
    if not i then break end
    if is_model then
      seen = seen + 1
      escaped_key = escaped_key or escaped
      not_string = not_string or body:byte(i) ~= 34
    end
    i = skip_value(body, i)
    if not i then break end
    i = skip_ws(body, i)
    if not i or body:byte(i) ~= 44 then break end
    i = skip_ws(body, i + 1)
  end
  if seen > 1 then return "duplicate" end
  if escaped_key then return "escaped" end
  if not_string then return "not_string" end
  return ""
end

core.register_fetches("FETCH", function(txn)
  return check(txn.sf:req_body() or "")
end)
""".replace("FETCH", MODEL_CHECK_FETCH)
