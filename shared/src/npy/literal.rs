//! The small subset of Python literal syntax that `.npy` headers use: a
//! dict of string keys to strings, booleans, and tuples of integers.

#[derive(Debug)]
pub(super) enum Literal {
    Str(String),
    Bool(bool),
    Tuple(Vec<u64>),
}

/// The entries of a header's dict, in order; trailing text is a fault.
pub(super) fn parse_dict(text: &str) -> std::result::Result<Vec<(String, Literal)>, String> {
    let mut p = LiteralParser {
        s: text.as_bytes(),
        i: 0,
    };
    p.skip_ws();
    p.expect(b'{')?;
    let mut out = Vec::new();
    loop {
        p.skip_ws();
        if p.eat(b'}') {
            break;
        }
        let key = p.string()?;
        p.skip_ws();
        p.expect(b':')?;
        p.skip_ws();
        let value = p.value()?;
        out.push((key, value));
        p.skip_ws();
        if p.eat(b',') {
            continue;
        }
        p.skip_ws();
        p.expect(b'}')?;
        break;
    }
    p.skip_ws();
    if p.i != p.s.len() {
        return Err("header has trailing characters after the dict".into());
    }
    Ok(out)
}

struct LiteralParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl LiteralParser<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8) -> std::result::Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!(
                "malformed header: expected '{}' at byte {}",
                c as char, self.i
            ))
        }
    }

    fn string(&mut self) -> std::result::Result<String, String> {
        let quote = match self.s.get(self.i) {
            Some(&q @ (b'\'' | b'"')) => q,
            _ => {
                return Err(format!(
                    "malformed header: expected a string at byte {}",
                    self.i
                ));
            }
        };
        self.i += 1;
        let start = self.i;
        while self.i < self.s.len() && self.s[self.i] != quote {
            if self.s[self.i] == b'\\' {
                return Err("malformed header: escapes in strings are not supported".into());
            }
            self.i += 1;
        }
        if self.i >= self.s.len() {
            return Err("malformed header: unterminated string".into());
        }
        let value = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
        self.i += 1;
        Ok(value)
    }

    fn value(&mut self) -> std::result::Result<Literal, String> {
        match self.s.get(self.i) {
            Some(b'\'' | b'"') => Ok(Literal::Str(self.string()?)),
            Some(b'(') => self.tuple(),
            _ => {
                let rest = &self.s[self.i..];
                if rest.starts_with(b"True") {
                    self.i += 4;
                    Ok(Literal::Bool(true))
                } else if rest.starts_with(b"False") {
                    self.i += 5;
                    Ok(Literal::Bool(false))
                } else {
                    Err(format!(
                        "malformed header: unexpected value at byte {}",
                        self.i
                    ))
                }
            }
        }
    }

    fn tuple(&mut self) -> std::result::Result<Literal, String> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        loop {
            self.skip_ws();
            if self.eat(b')') {
                break;
            }
            let start = self.i;
            while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
                self.i += 1;
            }
            if start == self.i {
                return Err(format!(
                    "malformed header: shape holds a non-integer at byte {start}"
                ));
            }
            let digits = std::str::from_utf8(&self.s[start..self.i]).expect("digits are ASCII");
            let dim: u64 = digits
                .parse()
                .map_err(|_| format!("shape dimension {digits} is too large"))?;
            // Python writes 1-tuples as `(n,)`, and longs once as `10L`.
            self.eat(b'L');
            dims.push(dim);
            self.skip_ws();
            if self.eat(b',') {
                continue;
            }
            self.skip_ws();
            self.expect(b')')?;
            break;
        }
        if dims.len() > 32 {
            return Err("shape has more than 32 dimensions".into());
        }
        Ok(Literal::Tuple(dims))
    }
}
