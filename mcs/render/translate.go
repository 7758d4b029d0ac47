package render

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/coreos/ign-converter/translate/v23tov30"
	"github.com/coreos/ign-converter/translate/v32tov22"
	"github.com/coreos/ign-converter/translate/v32tov31"
	"github.com/coreos/ign-converter/translate/v33tov32"
	"github.com/coreos/ign-converter/translate/v34tov33"
	ign22 "github.com/coreos/ignition/config/v2_2"
	ign23 "github.com/coreos/ignition/config/v2_3"
	ignerrors "github.com/coreos/ignition/v2/config/shared/errors"
	ignxlate "github.com/coreos/ignition/v2/config/translate"
	"github.com/coreos/ignition/v2/config/util"
	tr31 "github.com/coreos/ignition/v2/config/v3_1/translate"
	tr32 "github.com/coreos/ignition/v2/config/v3_2/translate"
	tr33 "github.com/coreos/ignition/v2/config/v3_3/translate"
	tr34 "github.com/coreos/ignition/v2/config/v3_4/translate"
	t34 "github.com/coreos/ignition/v2/config/v3_4/types"
	ign35 "github.com/coreos/ignition/v2/config/v3_5"
	tr35 "github.com/coreos/ignition/v2/config/v3_5/translate"
	t35 "github.com/coreos/ignition/v2/config/v3_5/types"
	"github.com/coreos/ignition/v2/config/validate"
)

// Errors of parsing and translation.
var (
	// ErrParse: a MachineConfig's spec.config is not an Ignition config of a
	// spec this package reads (3.0–3.5, or 2.x up to 2.2).
	ErrParse = errors.New("cannot parse Ignition config")
	// ErrTranslate: the config uses something the requested (older) spec
	// version cannot express, e.g. LUKS cex for 3.4, special mode bits for
	// 3.3, kernelArguments for 3.2, LUKS at all for 2.2.
	ErrTranslate = errors.New("config cannot be expressed in the requested Ignition spec version")
)

// Config is the internal form of every config: Ignition spec 3.5.
type Config = t35.Config

// ParseConfig parses an Ignition config of any spec 3.0–3.5 (translated up
// with Ignition's own translators) or 2.x up to 2.2 (translated up with
// ign-converter's v23tov30, as the MCO's ParseAndConvertConfig does) into
// spec 3.5. An empty or invalid config is an ErrParse.
func ParseConfig(raw []byte) (Config, error) {
	cfg, rpt, err := ign35.ParseCompatibleVersion(raw)
	if err == nil && !rpt.IsFatal() {
		return cfg, nil
	}
	if !errors.Is(err, ignerrors.ErrUnknownVersion) {
		return Config{}, fmt.Errorf("%w: %v %s", ErrParse, err, rpt.String())
	}
	cfg2, rpt2, err2 := ign22.Parse(raw)
	if err2 != nil || rpt2.IsFatal() {
		return Config{}, fmt.Errorf("%w: not spec 3.0–3.5 (%v) nor 2.x (%v %s)", ErrParse, err, err2, rpt2.String())
	}
	// Spec 2 only knows the "root" filesystem for MachineConfigs.
	cfg30, err := v23tov30.Translate(ign23.Translate(cfg2), map[string]string{"root": "/"})
	if err != nil {
		return Config{}, fmt.Errorf("%w: spec 2.2 to 3.0: %v", ErrParse, err)
	}
	return tr35.Translate(tr34.Translate(tr33.Translate(tr32.Translate(tr31.Translate(cfg30))))), nil
}

// Translate serialises cfg (spec 3.5) as spec v, translating down as the
// MCS does:
//
//	3.5 → 3.4  this package (translate35to34, below; the ign-converter the
//	           MCO pins has no v35tov34)
//	3.4 → 3.3  ign-converter v34tov33
//	3.3 → 3.2  ign-converter v33tov32
//	3.2 → 3.1  ign-converter v32tov31
//	3.2 → 2.2  ign-converter v32tov22
//
// Each step validates its input and output and refuses (ErrTranslate)
// fields the older spec cannot express instead of dropping them. The
// output is encoding/json of the typed config without the empty objects
// encoding/json cannot omit (dropEmptyObjects), as the MCS serves it.
func Translate(cfg Config, v Version) ([]byte, error) {
	out, err := translateTyped(cfg, v)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	return dropEmptyObjects(b)
}

func translateTyped(cfg Config, v Version) (any, error) {
	if !v.Valid() {
		return nil, fmt.Errorf("%w: %s is not a served version", ErrTranslate, v)
	}
	if v == V3_5 {
		if rpt := validate.ValidateWithContext(cfg, nil); rpt.IsFatal() {
			return nil, fmt.Errorf("%w: invalid 3.5 config: %s", ErrTranslate, rpt.String())
		}
		return cfg, nil
	}
	fail := func(err error) (any, error) {
		return nil, fmt.Errorf("%w (%s): %v", ErrTranslate, v, err)
	}
	c34, err := translate35to34(cfg)
	if err != nil {
		return fail(err)
	}
	if v == V3_4 {
		return c34, nil
	}
	c33, err := v34tov33.Translate(c34)
	if err != nil {
		return fail(err)
	}
	if v == V3_3 {
		return c33, nil
	}
	c32, err := v33tov32.Translate(c33)
	if err != nil {
		return fail(err)
	}
	switch v {
	case V3_2:
		return c32, nil
	case V3_1:
		c31, err := v32tov31.Translate(c32)
		if err != nil {
			return fail(err)
		}
		return c31, nil
	default: // V2_2
		c22, err := v32tov22.Translate(c32)
		if err != nil {
			return fail(err)
		}
		return c22, nil
	}
}

// translate35to34 translates spec 3.5 to 3.4 with Ignition's reflective
// translator, the way ign-converter's v34tov33 does one step lower: every
// field 3.4 has is copied; the only 3.5 addition, storage.luks[].cex, is
// refused when enabled (3.4 cannot express it) and dropped when unset or
// false (3.4's default is the same). Unlike Ignition's own 3.4→3.5 Luks
// translator, clevis.tang[].advertisement (a 3.4 field) is kept.
func translate35to34(in t35.Config) (t34.Config, error) {
	if rpt := validate.ValidateWithContext(in, nil); rpt.IsFatal() {
		return t34.Config{}, fmt.Errorf("invalid 3.5 config: %s", rpt.String())
	}
	for i, l := range in.Storage.Luks {
		if util.IsTrue(l.Cex.Enabled) {
			return t34.Config{}, fmt.Errorf("storage.luks.%d (%s): cex is not supported in spec 3.4", i, l.Name)
		}
	}
	tr := ignxlate.NewTranslator()
	tr.AddCustomTranslator(func(old t35.Ignition) (ret t34.Ignition) {
		ignxlate.NewTranslator().Translate(&old, &ret)
		ret.Version = t34.MaxVersion.String()
		return
	})
	tr.AddCustomTranslator(func(old t35.Luks) (ret t34.Luks) {
		t := ignxlate.NewTranslator()
		t.Translate(&old.Clevis, &ret.Clevis)
		t.Translate(&old.Device, &ret.Device)
		t.Translate(&old.Discard, &ret.Discard)
		t.Translate(&old.KeyFile, &ret.KeyFile)
		t.Translate(&old.Label, &ret.Label)
		t.Translate(&old.Name, &ret.Name)
		t.Translate(&old.OpenOptions, &ret.OpenOptions)
		t.Translate(&old.Options, &ret.Options)
		t.Translate(&old.UUID, &ret.UUID)
		t.Translate(&old.WipeVolume, &ret.WipeVolume)
		return
	})
	var out t34.Config
	tr.Translate(&in, &out)
	if rpt := validate.ValidateWithContext(out, nil); rpt.IsFatal() {
		return t34.Config{}, fmt.Errorf("translated 3.4 config is invalid: %s", rpt.String())
	}
	return out, nil
}
