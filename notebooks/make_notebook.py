"""Writes accuracy_sweep.ipynb from the cells below (edit here, then run this file)."""
from pathlib import Path

import nbformat

CELLS = [
    ("markdown", """# Accuracy sweep: which recipe fits the device?

Train a small digits model (Keras and PyTorch), run several compression recipes on it, measure
every artifact in its real runtime (LiteRT, onnxruntime), and pick the smallest artifact whose
accuracy is within 1 point of the original."""),
    ("code", """import os
from pathlib import Path

import compressor as cz
from compressor.backends.examples import train_keras_digits_cnn, train_torch_digits_cnn

RECIPES = ["fp16", "int8", "int8_qat", "prune50", "int8_prune30"]
OUT = Path(os.environ.get("SWEEP_OUT", "sweep-out"))
TARGET = "raspberry-pi-5-8gb\""""),
    ("markdown", "## Keras"),
    ("code", """keras_model = train_keras_digits_cnn(epochs=8)
keras_df = cz.sweep(keras_model, recipes=RECIPES, data="digits", out_dir=OUT / "keras",
                    target=TARGET, latency=False)
keras_df[["recipe", "format", "size_bytes", "gzip_bytes", "metric_value", "drop", "sparsity", "passed"]]"""),
    ("markdown", "## PyTorch"),
    ("code", """torch_model = train_torch_digits_cnn(epochs=8)
torch_df = cz.sweep(torch_model, recipes=RECIPES, data="digits", out_dir=OUT / "torch",
                    target=TARGET, latency=False)
torch_df[["recipe", "format", "size_bytes", "gzip_bytes", "metric_value", "drop", "sparsity", "passed"]]"""),
    ("markdown", "## Pareto front and the pick"),
    ("code", """import pandas as pd

df = pd.concat([keras_df.assign(framework="keras"), torch_df.assign(framework="torch")],
               ignore_index=True)
df["recipe"] = df["framework"] + "/" + df["recipe"]
fig = cz.plot_pareto(df, x="size_bytes", y="metric_value", title="digits: accuracy vs artifact size")
fig.savefig(OUT / "pareto.png", dpi=120)
fig"""),
    ("code", """within_one_point = df[(df["error"].isna()) & (df["drop"] <= 0.01)]
best = within_one_point.sort_values("size_bytes").iloc[0]
print(f"smallest artifact within 1 pt: {best['recipe']} {best['format']} "
      f"{best['size_bytes']:,} bytes, accuracy {best['metric_value']:.4f} (drop {best['drop']:+.4f})")
best_choice = {"recipe": best["recipe"], "format": best["format"],
               "size_bytes": int(best["size_bytes"]), "drop": float(best["drop"])}
best_choice"""),
]


def build() -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    makers = {"markdown": nbformat.v4.new_markdown_cell, "code": nbformat.v4.new_code_cell}
    notebook.cells = [makers[kind](source) for kind, source in CELLS]
    return notebook


if __name__ == "__main__":
    path = Path(__file__).with_name("accuracy_sweep.ipynb")
    nbformat.write(build(), path)
    print(f"wrote {path}")
