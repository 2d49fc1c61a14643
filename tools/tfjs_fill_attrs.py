"""Fill the attributes that TensorFlow 2.15's op registry requires but an older TF.js graph lacks.

tf2onnx (``--tfjs``) rebuilds each TF.js node as a TensorFlow NodeDef; graphs written by an older TensorFlow
lack attributes added since (``_FusedConv2D``: TArgs, num_host_args, filter_format, leakyrelu_alpha;
``TopKV2``: index_type), and TF refuses them ("NodeDef missing attr 'TArgs'"). Attributes with a registered
default get it; ``TArgs`` (no default) is ``num_args`` x DT_FLOAT. Run in the tensorflow venv:

    python tools/tfjs_fill_attrs.py centernet.json centernet_filled.json
"""

from __future__ import annotations

import json
import sys

import tensorflow as tf  # noqa: F401  (registers the ops)
from google.protobuf import json_format
from tensorflow.python.framework import op_def_registry


def main(src: str, dst: str) -> None:
    with open(src) as f:
        model = json.load(f)
    added: dict[tuple[str, str], int] = {}
    for node in model["modelTopology"]["node"]:
        op_def = op_def_registry.get(node["op"])
        if op_def is None:
            continue
        attrs = node.setdefault("attr", {})
        for a in op_def.attr:
            if a.name in attrs:
                continue
            if a.name == "TArgs":
                k = int(attrs.get("num_args", {}).get("i", "0"))
                attrs["TArgs"] = {"list": {"type": ["DT_FLOAT"] * k}}
            elif a.HasField("default_value"):
                attrs[a.name] = json.loads(json_format.MessageToJson(a.default_value))
            else:
                continue
            added[(node["op"], a.name)] = added.get((node["op"], a.name), 0) + 1
    with open(dst, "w") as f:
        json.dump(model, f)
    for (op, name), n in sorted(added.items()):
        print(f"filled {op}.{name} on {n} node(s)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
