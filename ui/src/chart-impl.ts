// The uPlot half of the charts, in its own chunk: loaded on the first page that shows a chart, so
// the sign-in page and the lists do not carry uPlot's ~50 KB.

import uPlot from "uplot";

// [min, max] of the x axis (epoch s); null: fitted to the data.
export type XRange = [number, number] | null;

export interface DrawnChart {
  setData(xs: number[], ys: number[], range: XRange): void;
  setWidth(width: number): void;
  destroy(): void;
}

export function drawChart(
  el: HTMLElement,
  label: string,
  unit: string,
  xs: number[],
  ys: number[],
  width: number,
  range: XRange,
): DrawnChart {
  // The time axis spans the whole window asked for (a lone point is not stretched over years).
  let xRange = range;
  const opts: uPlot.Options = {
    width: Math.max(200, width),
    height: 170,
    legend: { show: true, live: true },
    cursor: { drag: { x: true, y: false } },
    scales: {
      x: {
        time: true,
        range: (_u, min, max) => {
          if (xRange) return [Math.min(xRange[0], min), Math.max(xRange[1], max)];
          return min === max ? [min - 60, max + 60] : [min, max];
        },
      },
    },
    series: [
      {},
      {
        label: unit ? `${label} (${unit})` : label,
        stroke: "#1f5fbf",
        fill: "rgba(31, 95, 191, 0.08)",
        width: 1.5,
        points: { show: (u) => u.data[0].length < 90, size: 5 },
        spanGaps: false,
      },
    ],
    axes: [{ stroke: "#444", grid: { stroke: "#eee" } }, { stroke: "#444", grid: { stroke: "#eee" }, size: 60 }],
  };
  const chart = new uPlot(opts, [xs, ys], el);
  // uPlot does not consult the range function for a time axis with a single x value (it spans
  // years instead): set that case's window explicitly.
  const pinLonePoint = (nx: number[]) => {
    if (xRange && nx.length === 1) chart.setScale("x", { min: Math.min(xRange[0], nx[0]), max: Math.max(xRange[1], nx[0]) });
  };
  pinLonePoint(xs);
  return {
    setData(nx, ny, r) {
      xRange = r;
      chart.setData([nx, ny]);
      pinLonePoint(nx);
    },
    setWidth(w) {
      chart.setSize({ width: Math.max(200, w), height: 170 });
    },
    destroy() {
      chart.destroy();
    },
  };
}
