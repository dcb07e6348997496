import { readFile } from "fs";
import * as path from "path";

// Greets a user by name.
function greet(name, punctuation = "!") {
  return `Hello ${name}${punctuation}`;
}

class Counter {
  constructor(start) {
    this.value = start;
  }

  increment(step) {
    this.value += step;
    return this.value;
  }
}

const double = (x) => x * 2;
