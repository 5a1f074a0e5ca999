//! One figure, two files: every plot is drawn once as SVG and once as PNG, through one backend.
//! Owns: [`Canvas`] (plotters' SVG backend, or its bitmap backend at [`PNG_SCALE`]× the SVG's
//! size), the bundled font that both measure and the PNG draws text with, PNG encoding, and
//! [`render`], which writes `<name>.svg` and `<name>.png` only once both drew.
//! Must not: lay out a figure (the figure functions in `plots` do, in SVG pixels).

use super::{PlotError, plot_error};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontDesc;
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind,
};
use std::error::Error;
use std::path::Path;

/// DejaVu Sans, cut down to the characters plots use (`font/README.md`, licence beside it).
const FONT_BYTES: &[u8] = include_bytes!("font/DejaVuSans-subset.ttf");
/// The family name figures ask for (`plots::FONT`).
pub(super) const FONT_FAMILY: &str = "sans-serif";
/// The PNG has this many pixels per SVG pixel (1920×1200 for a 960×600 figure), at 144 dpi.
pub const PNG_SCALE: u32 = 2;

/// Where a figure draws: SVG text, or an RGB buffer `PNG_SCALE` times larger in each direction.
pub(super) enum Canvas<'a> {
    /// Vector output.
    Svg(SVGBackend<'a>),
    /// Raster output; every coordinate, width and font size is multiplied by `scale`.
    Bitmap {
        /// The buffer's backend.
        inner: BitMapBackend<'a>,
        /// Pixels per figure pixel.
        scale: i32,
    },
}

/// A backend error, as text (the two backends' error types differ).
#[derive(Debug)]
pub(super) struct CanvasError(String);

impl std::fmt::Display for CanvasError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for CanvasError {}

fn convert<E: Error + Send + Sync>(e: DrawingErrorKind<E>) -> DrawingErrorKind<CanvasError> {
    match e {
        DrawingErrorKind::DrawingError(e) => {
            DrawingErrorKind::DrawingError(CanvasError(e.to_string()))
        }
        DrawingErrorKind::FontError(f) => DrawingErrorKind::FontError(f),
    }
}

/// A style with its stroke width multiplied.
struct Scaled<'s, S>(&'s S, u32);

impl<S: BackendStyle> BackendStyle for Scaled<'_, S> {
    fn color(&self) -> BackendColor {
        self.0.color()
    }
    fn stroke_width(&self) -> u32 {
        self.0.stroke_width() * self.1
    }
}

fn scale_point((x, y): BackendCoord, s: i32) -> BackendCoord {
    (x * s, y * s)
}

impl DrawingBackend for Canvas<'_> {
    type ErrorType = CanvasError;

    fn get_size(&self) -> (u32, u32) {
        match self {
            Canvas::Svg(b) => b.get_size(),
            Canvas::Bitmap { inner, scale } => {
                let (w, h) = inner.get_size();
                (w / *scale as u32, h / *scale as u32)
            }
        }
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<CanvasError>> {
        match self {
            Canvas::Svg(b) => b.ensure_prepared().map_err(convert),
            Canvas::Bitmap { inner, .. } => inner.ensure_prepared().map_err(convert),
        }
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<CanvasError>> {
        match self {
            Canvas::Svg(b) => b.present().map_err(convert),
            Canvas::Bitmap { inner, .. } => inner.present().map_err(convert),
        }
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<CanvasError>> {
        match self {
            Canvas::Svg(b) => b.draw_pixel(point, color).map_err(convert),
            Canvas::Bitmap { inner, scale } => {
                let (x, y) = scale_point(point, *scale);
                inner
                    .draw_rect((x, y), (x + *scale - 1, y + *scale - 1), &color, true)
                    .map_err(convert)
            }
        }
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<CanvasError>> {
        match self {
            Canvas::Svg(b) => b.draw_line(from, to, style).map_err(convert),
            Canvas::Bitmap { inner, scale } => {
                let s = *scale;
                let style = Scaled(style, s as u32);
                // A wide line is a polygon; joining the ends keeps segments of a path joined.
                inner
                    .draw_path([scale_point(from, s), scale_point(to, s)], &style)
                    .map_err(convert)
            }
        }
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<CanvasError>> {
        match self {
            Canvas::Svg(b) => b
                .draw_rect(upper_left, bottom_right, style, fill)
                .map_err(convert),
            Canvas::Bitmap { inner, scale } => {
                let s = *scale;
                let (x1, y1) = scale_point(bottom_right, s);
                // A filled cell covers its whole scaled block, so neighbouring cells still meet.
                let end = if fill {
                    (x1 + s - 1, y1 + s - 1)
                } else {
                    (x1, y1)
                };
                inner
                    .draw_rect(
                        scale_point(upper_left, s),
                        end,
                        &Scaled(style, s as u32),
                        fill,
                    )
                    .map_err(convert)
            }
        }
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<CanvasError>> {
        match self {
            Canvas::Svg(b) => b.draw_path(path, style).map_err(convert),
            Canvas::Bitmap { inner, scale } => {
                let s = *scale;
                inner
                    .draw_path(
                        path.into_iter().map(|p| scale_point(p, s)),
                        &Scaled(style, s as u32),
                    )
                    .map_err(convert)
            }
        }
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<CanvasError>> {
        match self {
            Canvas::Svg(b) => b.draw_circle(center, radius, style, fill).map_err(convert),
            Canvas::Bitmap { inner, scale } => {
                let s = *scale;
                inner
                    .draw_circle(
                        scale_point(center, s),
                        radius * s as u32,
                        &Scaled(style, s as u32),
                        fill,
                    )
                    .map_err(convert)
            }
        }
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<CanvasError>> {
        match self {
            Canvas::Svg(b) => b.fill_polygon(vert, style).map_err(convert),
            Canvas::Bitmap { inner, scale } => {
                let s = *scale;
                inner
                    .fill_polygon(vert.into_iter().map(|p| scale_point(p, s)), style)
                    .map_err(convert)
            }
        }
    }

    fn draw_text<T: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &T,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<CanvasError>> {
        match self {
            Canvas::Svg(b) => b.draw_text(text, style, pos).map_err(convert),
            Canvas::Bitmap { inner, scale } => {
                let s = *scale;
                let font = FontDesc::new(style.family(), style.size() * s as f64, style.style())
                    .transform(style.transform());
                let scaled = TextStyle {
                    font,
                    color: style.color(),
                    pos: style.anchor(),
                };
                inner
                    .draw_text(text, &scaled, scale_point(pos, s))
                    .map_err(convert)
            }
        }
    }

    fn estimate_text_size<T: BackendTextStyle>(
        &self,
        text: &str,
        style: &T,
    ) -> Result<(u32, u32), DrawingErrorKind<CanvasError>> {
        // Both measure with the bundled font at the figure's size, so both lay out alike.
        match self {
            Canvas::Svg(b) => b.estimate_text_size(text, style).map_err(convert),
            Canvas::Bitmap { .. } => {
                let ((x0, y0), (x1, y1)) = style
                    .layout_box(text)
                    .map_err(|e| DrawingErrorKind::FontError(Box::new(e)))?;
                Ok(((x1 - x0) as u32, (y1 - y0) as u32))
            }
        }
    }
}

/// The drawing area every figure draws on.
pub(super) type Area<'a> = DrawingArea<Canvas<'a>, Shift>;
/// What a figure's drawing returns.
pub(super) type DrawResult = Result<(), Box<dyn Error>>;

/// Registers the bundled font under [`FONT_FAMILY`] (once per process): plotters measures and
/// draws text only with registered fonts, never the system's.
fn register_font() -> Result<(), String> {
    static REGISTERED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, FONT_BYTES)
                .map_err(|_| "the bundled font does not parse".to_string())
        })
        .clone()
}

/// Encodes an RGB buffer as PNG, marked 72·[`PNG_SCALE`] dpi so it prints at the SVG's size.
fn encode_png(width: u32, height: u32, rgb: &[u8]) -> Result<Vec<u8>, png::EncodingError> {
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, width, height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        // 72 dpi per figure pixel, in pixels per metre.
        let ppm = (72.0 * PNG_SCALE as f64 / 0.0254).round() as u32;
        encoder.set_pixel_dims(Some(png::PixelDimensions {
            xppu: ppm,
            yppu: ppm,
            unit: png::Unit::Meter,
        }));
        let mut writer = encoder.write_header()?;
        writer.write_image_data(rgb)?;
        writer.finish()?;
    }
    Ok(out)
}

/// Draws a figure of `size` SVG pixels twice, as SVG and as PNG, then writes `path` (an `.svg`)
/// and the PNG beside it (same name, `.png`). Nothing is written unless both drew; the parent
/// directory must exist.
pub(super) fn render(
    path: &Path,
    size: (u32, u32),
    draw: impl Fn(&Area<'_>) -> DrawResult,
) -> Result<(), PlotError> {
    register_font().map_err(|e| plot_error(path, e))?;
    let mut svg = String::new();
    {
        let root = Canvas::Svg(SVGBackend::with_string(&mut svg, size)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_error(path, e))?;
        draw(&root).map_err(|e| plot_error(path, e))?;
        root.present().map_err(|e| plot_error(path, e))?;
    }
    let (w, h) = (size.0 * PNG_SCALE, size.1 * PNG_SCALE);
    let mut rgb = vec![255u8; w as usize * h as usize * 3];
    {
        let inner = BitMapBackend::with_buffer(&mut rgb, (w, h));
        let root = Canvas::Bitmap {
            inner,
            scale: PNG_SCALE as i32,
        }
        .into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_error(path, e))?;
        draw(&root).map_err(|e| plot_error(path, e))?;
        root.present().map_err(|e| plot_error(path, e))?;
    }
    let png = encode_png(w, h, &rgb).map_err(|e| plot_error(path, e))?;
    std::fs::write(path, svg).map_err(|e| plot_error(path, e))?;
    let png_path = path.with_extension("png");
    std::fs::write(&png_path, png).map_err(|e| plot_error(&png_path, e))
}
