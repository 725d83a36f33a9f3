//! GGUF metadata values: the 13 value types and typed values.

/// A GGUF metadata value type with its on-disk id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    /// `uint8`
    U8 = 0,
    /// `int8`
    I8 = 1,
    /// `uint16`
    U16 = 2,
    /// `int16`
    I16 = 3,
    /// `uint32`
    U32 = 4,
    /// `int32`
    I32 = 5,
    /// `float32`
    F32 = 6,
    /// `bool` (one byte, 0 or 1)
    Bool = 7,
    /// UTF-8 string with a u64 length prefix
    String = 8,
    /// homogeneous array: element type, u64 count, elements
    Array = 9,
    /// `uint64`
    U64 = 10,
    /// `int64`
    I64 = 11,
    /// `float64`
    F64 = 12,
}

impl ValueType {
    /// The type with on-disk id `id`.
    pub fn from_u32(id: u32) -> Option<Self> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The on-disk id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The name gguf-py and ggml use (`"u32"`, `"f32"`, `"str"`, `"arr"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "str",
            ValueType::Array => "arr",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }

    /// Size in bytes of one value of a fixed-size type; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<u64> {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => Some(1),
            ValueType::U16 | ValueType::I16 => Some(2),
            ValueType::U32 | ValueType::I32 | ValueType::F32 => Some(4),
            ValueType::U64 | ValueType::I64 | ValueType::F64 => Some(8),
            ValueType::String | ValueType::Array => None,
        }
    }
}

impl std::fmt::Display for ValueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A homogeneous GGUF array. Nested arrays are not supported (no Spark or llama.cpp key uses them;
/// the reader rejects them).
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    /// `u8` elements
    U8(Vec<u8>),
    /// `i8` elements
    I8(Vec<i8>),
    /// `u16` elements
    U16(Vec<u16>),
    /// `i16` elements
    I16(Vec<i16>),
    /// `u32` elements
    U32(Vec<u32>),
    /// `i32` elements
    I32(Vec<i32>),
    /// `f32` elements
    F32(Vec<f32>),
    /// `bool` elements
    Bool(Vec<bool>),
    /// string elements
    String(Vec<String>),
    /// `u64` elements
    U64(Vec<u64>),
    /// `i64` elements
    I64(Vec<i64>),
    /// `f64` elements
    F64(Vec<f64>),
}

impl Array {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` rendered as text (for `inspect`), `None` past the end.
    pub fn elem_to_string(&self, i: usize) -> Option<String> {
        Some(match self {
            Array::U8(v) => v.get(i)?.to_string(),
            Array::I8(v) => v.get(i)?.to_string(),
            Array::U16(v) => v.get(i)?.to_string(),
            Array::I16(v) => v.get(i)?.to_string(),
            Array::U32(v) => v.get(i)?.to_string(),
            Array::I32(v) => v.get(i)?.to_string(),
            Array::F32(v) => format!("{:?}", v.get(i)?),
            Array::Bool(v) => v.get(i)?.to_string(),
            Array::String(v) => format!("{:?}", v.get(i)?),
            Array::U64(v) => v.get(i)?.to_string(),
            Array::I64(v) => v.get(i)?.to_string(),
            Array::F64(v) => format!("{:?}", v.get(i)?),
        })
    }
}

/// A typed GGUF metadata value. The type is kept exactly: a `u32` written stays a `u32`.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `uint8`
    U8(u8),
    /// `int8`
    I8(i8),
    /// `uint16`
    U16(u16),
    /// `int16`
    I16(i16),
    /// `uint32`
    U32(u32),
    /// `int32`
    I32(i32),
    /// `float32`
    F32(f32),
    /// `bool`
    Bool(bool),
    /// UTF-8 string
    String(String),
    /// homogeneous array
    Array(Array),
    /// `uint64`
    U64(u64),
    /// `int64`
    I64(i64),
    /// `float64`
    F64(f64),
}

impl Value {
    /// The value's GGUF type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value if it is exactly a `u32` (no conversion from other integer types).
    pub fn as_u32(&self) -> Option<u32> {
        match self {
            Value::U32(v) => Some(*v),
            _ => None,
        }
    }

    /// The value if it is exactly an `i32`.
    pub fn as_i32(&self) -> Option<i32> {
        match self {
            Value::I32(v) => Some(*v),
            _ => None,
        }
    }

    /// The value if it is exactly a `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::U64(v) => Some(*v),
            _ => None,
        }
    }

    /// The value if it is exactly an `f32`.
    pub fn as_f32(&self) -> Option<f32> {
        match self {
            Value::F32(v) => Some(*v),
            _ => None,
        }
    }

    /// The value if it is exactly an `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::F64(v) => Some(*v),
            _ => None,
        }
    }

    /// The value if it is exactly a `bool`.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(v) => Some(*v),
            _ => None,
        }
    }

    /// The value if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(v) => Some(v),
            _ => None,
        }
    }

    /// The value if it is an array.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(v) => Some(v),
            _ => None,
        }
    }

    /// A human-readable type: `"u32"`, or `"arr[str]"` for arrays.
    pub fn type_name(&self) -> String {
        match self {
            Value::Array(a) => format!("arr[{}]", a.elem_type().name()),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value as text; arrays longer than `max_elems` show their first elements and length.
    pub fn display(&self, max_elems: usize) -> String {
        match self {
            Value::U8(v) => v.to_string(),
            Value::I8(v) => v.to_string(),
            Value::U16(v) => v.to_string(),
            Value::I16(v) => v.to_string(),
            Value::U32(v) => v.to_string(),
            Value::I32(v) => v.to_string(),
            Value::F32(v) => format!("{v:?}"),
            Value::Bool(v) => v.to_string(),
            Value::String(v) => format!("{v:?}"),
            Value::U64(v) => v.to_string(),
            Value::I64(v) => v.to_string(),
            Value::F64(v) => format!("{v:?}"),
            Value::Array(a) => {
                let n = a.len();
                let shown: Vec<String> = (0..n.min(max_elems))
                    .filter_map(|i| a.elem_to_string(i))
                    .collect();
                if n > max_elems {
                    format!("[{}, ...] ({n} elements)", shown.join(", "))
                } else {
                    format!("[{}]", shown.join(", "))
                }
            }
        }
    }
}
