import { Counter } from "./app";

export interface Point {
  x: number;
  y: number;
}

export type Pair = [number, number];

export function distance(a: Point, b: Point): number {
  return Math.hypot(a.x - b.x, a.y - b.y);
}

export class Grid {
  cells: number[] = [];

  size(): number {
    return this.cells.length;
  }
}
