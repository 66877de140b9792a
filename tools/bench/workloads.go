package main

import "strings"

// Workload is one Python script run identically by every launcher.
type Workload struct {
	Name string
	// Code is the whole script, as sent in the API's "code" field and as
	// passed to `python3 -c` by the peers.
	Code string
	// Stdout is the exact output a correct run prints; anything else counts
	// as a failure.
	Stdout string
	// Artifact, when set, must come back from the API as an artifact
	// (output/artifacts/<Artifact>) with a PNG signature.
	Artifact string
}

// workloadPrint is the smallest useful execution: the latency floor of the
// whole request path.
var workloadPrint = Workload{Name: "print", Code: "print(1)\n", Stdout: "1\n"}

// workloadPandas is the typical Agent step: build a 100k-row frame, group it,
// draw one chart with matplotlib and save it as a PNG artifact. It imports
// exactly the default pool preload (numpy, pandas, matplotlib with Agg,
// matplotlib.pyplot), so a warm sandbox pays none of the import.
var workloadPandas = Workload{
	Name: "pandas",
	Code: strings.TrimLeft(`
import os
import numpy as np
import pandas as pd
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

rng = np.random.default_rng(0)
n = 100_000
df = pd.DataFrame({"key": rng.integers(0, 100, n), "x": rng.random(n), "y": rng.normal(size=n)})
g = df.groupby("key").agg(x_mean=("x", "mean"), y_sum=("y", "sum"), rows=("x", "size"))
os.makedirs("output/artifacts", exist_ok=True)
fig, ax = plt.subplots(figsize=(4, 3), dpi=80)
ax.bar(g.index, g["x_mean"])
ax.set_xlabel("key")
ax.set_ylabel("mean x")
fig.savefig("output/artifacts/groupby.png")
plt.close(fig)
print(len(g), int(g["rows"].sum()))
`, "\n"),
	Stdout:   "100 100000\n",
	Artifact: "groupby.png",
}

// workloads are the API and peer workloads, in report order.
var workloads = []Workload{workloadPrint, workloadPandas}

// workloadByName finds a workload by its Name.
func workloadByName(name string) (Workload, bool) {
	for _, w := range workloads {
		if w.Name == name {
			return w, true
		}
	}
	return Workload{}, false
}
