use std::collections::HashMap;
use std::fmt::{self, Display};

pub struct Stack {
    items: Vec<i32>,
}

impl Stack {
    pub fn push(&mut self, value: i32) {
        self.items.push(value);
    }

    pub fn peek(&self) -> Option<&i32> {
        self.items.last()
    }
}

pub fn count_words(text: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for word in text.split_whitespace() {
        *counts.entry(word.to_string()).or_insert(0) += 1;
    }
    counts
}
