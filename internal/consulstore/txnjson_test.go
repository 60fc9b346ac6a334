package consulstore

import (
	"encoding/json"
	"reflect"
	"testing"
)

// Answers as Consul v1.20 writes them (captured from a dev agent): a
// committed hand-off of four ops, and a rolled-back one.
const (
	answerCommitted = `{
    "Results": [
        {
            "KV": {
                "LockIndex": 3,
                "Key": "lockbroker/sessions/ff2b3def-11db-fc17-ec49-8e21e34caa85",
                "Flags": 0,
                "Value": null,
                "Session": "ff2b3def-11db-fc17-ec49-8e21e34caa85",
                "CreateIndex": 19,
                "ModifyIndex": 27
            }
        },
        {
            "KV": {
                "LockIndex": 1,
                "Key": "a/b",
                "Flags": 3304740253564472344,
                "Value": "eyJob2xkcyI6e319",
                "Session": "",
                "CreateIndex": 19,
                "ModifyIndex": 27,
                "Namespace": "default",
                "Partition": "default"
            }
        }
    ],
    "Errors": null
}`
	answerRolledBack = `{
    "Results": null,
    "Errors": [
        {
            "OpIndex": 0,
            "What": "failed to set key \"a/b\", index is stale"
        }
    ]
}`
)

// FuzzDecodeTxnAnswer: decodeTxnAnswer's answer and error are
// json.Unmarshal's, for any body; the scanner accepts only what
// json.Unmarshal reads the same way.
func FuzzDecodeTxnAnswer(f *testing.F) {
	for _, s := range []string{
		answerCommitted, answerRolledBack, `{"Results":[],"Errors":[]}`, `{"Results":[{"KV":null}]}`,
		`{"Errors":[{"OpIndex":2,"What":"lock held"}],"Results":null}`, `{"results":[{"KV":{"Key":"x"}}]}`,
		`{"Results":[{"KV":{"Key":"x","key":"y"}}]}`, `{"Results":[{"KV":{"Value":""}}]}`,
		`{"Results":[{"KV":{"Flags":18446744073709551615}}]}`, `{"Results":[{"KV":{"Flags":18446744073709551616}}]}`,
		`{"Results":[{"KV":{"LockIndex":1e3}}]}`, `{"Results":[{"KV":{"LockIndex":-1}}]}`, `{"Results":[{"KV":{"Value":"eA=="}}]} x`,
		`{"Results":[{"KV":{"Other":{"a":[1,"b",null,true,{"c":false}]}}}]}`, `{"Results":null,"Results":[{}]}`,
		`{"Results":[{"KV":{"Key":"é"}}]}`, `{"Results":[{"KV":{"Value":"e===="}}]}`, `null`, ``, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var want txnAnswer
		wantErr := json.Unmarshal(data, &want)
		var got txnAnswer
		gotErr := decodeTxnAnswer(data, &got)
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("error %v, json.Unmarshal's %v", gotErr, wantErr)
		}
		if wantErr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("decoded\n%#v\njson.Unmarshal\n%#v", got, want)
		}
		var scanned txnAnswer
		if scanTxnAnswer(data, &scanned) && (wantErr != nil || !reflect.DeepEqual(scanned, want)) {
			t.Fatalf("scanner accepted what json.Unmarshal reads otherwise (%v)", wantErr)
		}
	})
}

// TestScannerReadsConsulsAnswers: the committed answer Consul writes is
// read by the scanner itself, not by the json.Unmarshal fallback.
func TestScannerReadsConsulsAnswers(t *testing.T) {
	var a txnAnswer
	if !scanTxnAnswer([]byte(answerCommitted), &a) {
		t.Fatal("scanner refused Consul's answer")
	}
	if len(a.Results) != 2 || a.Results[0].KV.Value != nil || string(a.Results[1].KV.Value) != `{"holds":{}}` ||
		a.Results[1].KV.Flags != 3304740253564472344 || a.Results[0].KV.ModifyIndex != 27 {
		t.Fatalf("scanned %+v", a)
	}
	// Its error messages have escaped quotes: json.Unmarshal reads those.
	if scanTxnAnswer([]byte(answerRolledBack), &txnAnswer{}) {
		t.Fatal("scanner read an escaped string")
	}
}

func BenchmarkDecodeTxnAnswer(b *testing.B) {
	data := []byte(answerCommitted)
	b.Run("scanner", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var a txnAnswer
			_ = decodeTxnAnswer(data, &a)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var a txnAnswer
			_ = json.Unmarshal(data, &a)
		}
	})
}
