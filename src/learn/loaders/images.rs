//! A folder of class sub-folders of PNG or JPEG images (`DIR/<class name>/*.png`), the layout of
//! torchvision's `ImageFolder`: a researcher's own images, for a scenario, a node and `predict`.
//! Owns: [`read_image_folder`]: which files count, decoding, the one-size rule, grey or RGB.
//! Must not: resize or crop (images of another size are refused, naming the file), number
//! classes across folders (`own.rs`), or split samples between silos.

use super::own::Labelled;
use super::{corrupt, io_err};
use crate::learn::data::DataError;
use std::path::{Path, PathBuf};

/// File extensions read as images (case-insensitive); other files are skipped.
pub const IMAGE_EXTENSIONS: [&str; 3] = ["png", "jpg", "jpeg"];

/// Reads `dir/<class>/<image>`: every sub-folder (sorted by name; hidden ones skipped) is a
/// class named by the folder, every `.png`, `.jpg` or `.jpeg` file in it (sorted by name) one
/// sample. All images must have the size of the first one (resize them beforehand); an image is
/// never resized. When every image is grey the samples are `[1, height, width]`, else
/// `[3, height, width]` (R, G, B planes; grey images repeated in all three; alpha dropped).
/// Pixels are scaled to [0, 1].
///
/// Errors name the folder or file: `dir` missing or not a folder, no class sub-folder, a class
/// folder without images, an image that does not decode, an image of another size.
pub fn read_image_folder(dir: &Path) -> Result<Labelled, DataError> {
    if !dir.is_dir() {
        return Err(DataError::Missing(format!(
            "{}: no such folder (an image data set is a folder of class sub-folders, \
             DIR/<class>/*.png)",
            dir.display()
        )));
    }
    let classes = sorted_entries(dir, |p| p.is_dir())?;
    if classes.is_empty() {
        return Err(corrupt(
            dir,
            "no class sub-folders: expected DIR/<class name>/*.png (or .jpg, .jpeg)",
        ));
    }
    let mut size: Option<(u32, u32, PathBuf)> = None;
    let mut pixels: Vec<u8> = Vec::new();
    let mut labels = Vec::new();
    let mut names = Vec::new();
    // The colour images, and the first of them, for the warning when grey ones are widened.
    let mut colour = 0usize;
    let mut first_colour: Option<PathBuf> = None;
    for (k, class) in classes.iter().enumerate() {
        let files = sorted_entries(class, |p| {
            p.is_file()
                && p.extension().is_some_and(|e| {
                    IMAGE_EXTENSIONS.contains(&e.to_string_lossy().to_lowercase().as_str())
                })
        })?;
        if files.is_empty() {
            return Err(corrupt(
                class,
                "class folder holds no .png, .jpg or .jpeg images",
            ));
        }
        names.push(file_name(class));
        for f in files {
            let img = image::ImageReader::open(&f)
                .map_err(|e| io_err(&f, e))?
                .with_guessed_format()
                .map_err(|e| io_err(&f, e))?
                .decode()
                .map_err(|e| corrupt(&f, format!("not a readable PNG or JPEG image: {e}")))?;
            let (w, h) = (img.width(), img.height());
            match &size {
                None => size = Some((w, h, f.clone())),
                Some((sw, sh, first)) if (*sw, *sh) != (w, h) => {
                    return Err(corrupt(
                        &f,
                        format!(
                            "image is {w}×{h}, but {} is {sw}×{sh}; all images must have one \
                             size (resize them beforehand)",
                            first.display()
                        ),
                    ));
                }
                _ => {}
            }
            if img.color().has_color() {
                colour += 1;
                first_colour.get_or_insert_with(|| f.clone());
            }
            let rgb = img.to_rgb8();
            // Planes R, G, B.
            for c in 0..3 {
                pixels.extend(rgb.pixels().map(|p| p.0[c]));
            }
            labels.push(k as u32);
        }
    }
    let (w, h, _) = size.expect("at least one class folder with one image");
    let plane = (w * h) as usize;
    let channels = if colour > 0 { 3 } else { 1 };
    if let Some(first) = first_colour.filter(|_| colour < labels.len()) {
        // A few colour images among grey ones (a stray RGB export) triple the input: say so.
        tracing::warn!(
            "{}: {colour} of {} images are in colour (the first: {}), so every image is read \
             as RGB, 3 channels, the grey ones repeated in each; convert the colour ones to grey \
             if the data set is grey",
            dir.display(),
            labels.len(),
            first.display()
        );
    }
    let features = pixels
        .chunks(3 * plane)
        .flat_map(|img| img[..channels * plane].iter())
        .map(|&b| f32::from(b) / 255.0)
        .collect();
    Ok(Labelled {
        features,
        sample_shape: vec![channels, h as usize, w as usize],
        labels,
        names,
        numbered: false,
        path: dir.to_path_buf(),
    })
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The entries of `dir` that pass `keep`, hidden ones skipped, sorted by name.
fn sorted_entries(dir: &Path, keep: impl Fn(&Path) -> bool) -> Result<Vec<PathBuf>, DataError> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| io_err(dir, e))?
        .map(|e| e.map(|e| e.path()).map_err(|e| io_err(dir, e)))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|p| !file_name(p).starts_with('.') && keep(p))
        .collect();
    out.sort();
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes `dir/<class>/<i>.png`, `n` images per class, `w`×`h`, grey or RGB; pixel values
    /// depend on the class and the image number.
    pub(crate) fn write_folder(dir: &Path, classes: &[&str], n: usize, w: u32, h: u32, rgb: bool) {
        for (k, class) in classes.iter().enumerate() {
            let d = dir.join(class);
            std::fs::create_dir_all(&d).unwrap();
            for i in 0..n {
                let v = |x: u32, y: u32| ((k * 60 + i * 7) as u32 + x + y) as u8;
                let p = d.join(format!("{i}.png"));
                if rgb {
                    image::RgbImage::from_fn(w, h, |x, y| image::Rgb([v(x, y), 0, 255]))
                        .save(&p)
                        .unwrap();
                } else {
                    image::GrayImage::from_fn(w, h, |x, y| image::Luma([v(x, y)]))
                        .save(&p)
                        .unwrap();
                }
            }
        }
    }

    #[test]
    fn classes_are_sorted_folders_and_pixels_are_planes() {
        let tmp = tempfile::tempdir().unwrap();
        write_folder(tmp.path(), &["zebra", "ant"], 2, 3, 2, false);
        std::fs::write(tmp.path().join("ant/notes.txt"), "skipped").unwrap();
        let s = read_image_folder(tmp.path()).unwrap();
        assert_eq!(s.names, ["ant", "zebra"]);
        assert_eq!(s.labels, [0, 0, 1, 1]);
        assert_eq!(s.sample_shape, [1, 2, 3]);
        // ant is class k = 1 in write_folder: v = 60 + x + y.
        assert_eq!(s.features[..3], [60.0 / 255.0, 61.0 / 255.0, 62.0 / 255.0]);
        let tmp = tempfile::tempdir().unwrap();
        write_folder(tmp.path(), &["a", "b"], 1, 2, 2, true);
        let s = read_image_folder(tmp.path()).unwrap();
        assert_eq!(s.sample_shape, [3, 2, 2]);
        // R plane, then G (0), then B (255).
        assert_eq!(s.features[4..8], [0.0; 4]);
        assert_eq!(s.features[8..12], [1.0; 4]);
        let jpg = tmp.path().join("b/x.JPG");
        image::RgbImage::from_pixel(2, 2, image::Rgb([9, 9, 9]))
            .save_with_format(&jpg, image::ImageFormat::Jpeg)
            .unwrap();
        assert_eq!(read_image_folder(tmp.path()).unwrap().len(), 3);
    }

    #[test]
    fn bad_folders_and_images_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let e = read_image_folder(&tmp.path().join("nope")).unwrap_err();
        assert!(e.to_string().contains("nope") && e.to_string().contains("no such folder"));
        let e = read_image_folder(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("no class sub-folders"), "{e}");
        write_folder(tmp.path(), &["a"], 2, 4, 4, false);
        std::fs::create_dir(tmp.path().join("b")).unwrap();
        let e = read_image_folder(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("/b:") && e.contains("no .png"), "{e}");
        image::GrayImage::new(5, 4)
            .save(tmp.path().join("b/odd.png"))
            .unwrap();
        let e = read_image_folder(tmp.path()).unwrap_err().to_string();
        assert!(
            e.contains("odd.png")
                && e.contains("5×4")
                && e.contains("4×4")
                && e.contains("a/0.png"),
            "{e}"
        );
        std::fs::write(tmp.path().join("b/odd.png"), b"not a png").unwrap();
        let e = read_image_folder(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("odd.png") && e.contains("not a readable"), "{e}");
    }
}
