"""Hand-written vendor baseline: onnxruntime's own dynamic int8 quantization of a float32 ONNX
file, as its documentation shows it, no toolkit:

    python onnx_dynamic.py FP32.onnx OUT.onnx     -> one JSON line {"artifact", "timings_s"}

quantize_dynamic with its defaults (one QInt8 scale per weight matrix, 8-bit); activations are
quantized at run time (DynamicQuantizeLinear -> MatMulInteger). Default op types (MatMul,
Gather, Attention, ...).
"""
import time

T0 = time.perf_counter()

import argparse
import json

from onnxruntime.quantization import quantize_dynamic

IMPORT_S = time.perf_counter() - T0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("fp32")
    parser.add_argument("out")
    args = parser.parse_args()
    started = time.perf_counter()
    quantize_dynamic(args.fp32, args.out)
    print(json.dumps({"artifact": args.out,
                      "timings_s": {"import": round(IMPORT_S, 3),
                                    "make": round(time.perf_counter() - started, 3)}}))


if __name__ == "__main__":
    main()
