"""Hand-written vendor baseline: onnxruntime's own dynamic int8 quantization of a float32 ONNX
file, as its documentation shows it, no toolkit:

    python onnx_dynamic.py FP32.onnx OUT.onnx     -> one JSON line {"artifact", "timings_s"}

quantize_dynamic with per-channel int8 weights (QInt8); activations are quantized at run time
(DynamicQuantizeLinear -> MatMulInteger). Default op types (MatMul, Gather, Attention, ...).
"""
import time

T0 = time.perf_counter()

import argparse
import json

from onnxruntime.quantization import QuantType, quantize_dynamic

IMPORT_S = time.perf_counter() - T0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("fp32")
    parser.add_argument("out")
    args = parser.parse_args()
    started = time.perf_counter()
    quantize_dynamic(args.fp32, args.out, per_channel=True, weight_type=QuantType.QInt8)
    print(json.dumps({"artifact": args.out,
                      "timings_s": {"import": round(IMPORT_S, 3),
                                    "make": round(time.perf_counter() - started, 3)}}))


if __name__ == "__main__":
    main()
