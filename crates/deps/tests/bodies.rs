//! Function bodies as `pg_get_functiondef` prints them: what they read, write and call.

use pgfresh_deps::body::{analyze_body, DYNAMIC_SQL};
use pgfresh_sql::{FuncName, RelName};

fn names(v: &[RelName]) -> Vec<String> {
    let mut n: Vec<String> = v.iter().map(ToString::to_string).collect();
    n.sort();
    n
}

fn calls(v: &[FuncName]) -> Vec<String> {
    let mut n: Vec<String> = v.iter().map(ToString::to_string).collect();
    n.sort();
    n
}

const AUDIT: &str = r#"CREATE OR REPLACE FUNCTION public.audit_orders()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
  n integer := (SELECT count(*) FROM app.settings);
  c CURSOR FOR SELECT id FROM cursor_src;
  r record;
BEGIN
  IF TG_OP = 'DELETE' THEN
    INSERT INTO audit_log(op, row_id) VALUES (TG_OP, OLD.id);
    RETURN OLD;
  END IF;
  SELECT total INTO n FROM "Totals" WHERE id = NEW.id;
  n := n + (SELECT max(v) FROM assign_src);
  IF EXISTS (SELECT 1 FROM cond_src WHERE id = NEW.id) THEN
    PERFORM app.recalc(NEW.id);
  END IF;
  FOR r IN SELECT * FROM loop_src LOOP
    UPDATE app.order_totals SET total = total + 1 WHERE id = r.id;
  END LOOP;
  RETURN NEW;
END
$function$
"#;

#[test]
fn plpgsql_trigger_function() {
    let fx = analyze_body("plpgsql", Some(AUDIT));
    assert_eq!(fx.unanalysable, None);
    assert_eq!(names(&fx.writes), ["app.order_totals", "audit_log"]);
    assert_eq!(
        names(&fx.reads),
        [
            "\"Totals\"",
            "app.settings",
            "assign_src",
            "cond_src",
            "cursor_src",
            "loop_src"
        ]
    );
    assert_eq!(calls(&fx.calls), ["app.recalc", "count", "max"]);
}

#[test]
fn dynamic_sql_in_every_form_is_unanalysable() {
    for stmt in [
        "EXECUTE format('DELETE FROM %I WHERE id = $1', TG_TABLE_NAME) USING OLD.id;",
        "EXECUTE 'TRUNCATE t';",
        "FOR r IN EXECUTE 'SELECT * FROM ' || tbl LOOP END LOOP;",
        "RETURN QUERY EXECUTE 'SELECT id FROM ' || tbl;",
        "OPEN rc FOR EXECUTE 'SELECT 1';",
    ] {
        let def = format!(
            "CREATE OR REPLACE FUNCTION public.f(tbl text)\n RETURNS SETOF integer\n LANGUAGE plpgsql\nAS $function$\nDECLARE\n  r record;\n  rc refcursor;\nBEGIN\n  INSERT INTO seen VALUES (1);\n  {stmt}\nEND\n$function$\n"
        );
        let fx = analyze_body("plpgsql", Some(&def));
        assert_eq!(fx.unanalysable.as_deref(), Some(DYNAMIC_SQL), "{stmt}");
    }
}

#[test]
fn static_return_query_and_open_are_analysed() {
    let def = "CREATE OR REPLACE FUNCTION public.f()\n RETURNS SETOF integer\n LANGUAGE plpgsql\n STABLE\nAS $function$\nDECLARE rc refcursor;\nBEGIN\n  OPEN rc FOR SELECT id FROM open_src;\n  RETURN QUERY SELECT id FROM rq_src;\nEND\n$function$\n";
    let fx = analyze_body("plpgsql", Some(def));
    assert_eq!(fx.unanalysable, None);
    assert_eq!(names(&fx.reads), ["open_src", "rq_src"]);
    assert!(fx.writes.is_empty());
}

#[test]
fn do_block_and_parse_failures_are_unanalysable() {
    let def = "CREATE OR REPLACE FUNCTION public.f()\n RETURNS void\n LANGUAGE plpgsql\nAS $function$\nBEGIN\n  DO $$ BEGIN PERFORM 1; END $$;\nEND\n$function$\n";
    assert_eq!(
        analyze_body("plpgsql", Some(def)).unanalysable.as_deref(),
        Some("DO block")
    );
    let broken = "CREATE OR REPLACE FUNCTION public.f()\n RETURNS void\n LANGUAGE plpgsql\nAS $function$\nBEGIN\n  INSRT INTO t VALUES (1);\nEND\n$function$\n";
    let fx = analyze_body("plpgsql", Some(broken));
    assert!(fx.unanalysable.unwrap().contains("parse"), "broken body");
}

#[test]
fn writes_the_body_cannot_name_are_unanalysable() {
    for stmt in [
        "TRUNCATE parent CASCADE;",
        "PERFORM nextval(seq_name);",
        "PERFORM setval(pg_get_serial_sequence('t', 'id'), 1);",
    ] {
        let def = format!(
            "CREATE OR REPLACE FUNCTION public.f(seq_name text)\n RETURNS void\n LANGUAGE plpgsql\nAS $function$\nBEGIN\n  {stmt}\nEND\n$function$\n"
        );
        let fx = analyze_body("plpgsql", Some(&def));
        assert!(
            fx.unanalysable
                .as_deref()
                .is_some_and(|u| u.contains("does not name")),
            "{stmt}: {:?}",
            fx.unanalysable
        );
    }
    let named = "CREATE OR REPLACE FUNCTION public.f()\n RETURNS bigint\n LANGUAGE sql\nAS $function$ SELECT nextval('order_seq') $function$\n";
    let fx = analyze_body("sql", Some(named));
    assert_eq!(fx.unanalysable, None);
    assert_eq!(names(&fx.writes), ["order_seq"]);
}

#[test]
fn sql_function_with_string_body() {
    let def = "CREATE OR REPLACE FUNCTION app.place_order(customer integer, amount numeric)\n RETURNS bigint\n LANGUAGE sql\nAS $function$\n  INSERT INTO app.orders(customer, amount) VALUES ($1, $2);\n  UPDATE ledger SET balance = balance - amount WHERE customer_id = customer;\n  SELECT currval('app.orders_id_seq') FROM app.customers LIMIT 1;\n$function$\n";
    let fx = analyze_body("sql", Some(def));
    assert_eq!(fx.unanalysable, None);
    assert_eq!(names(&fx.writes), ["app.orders", "ledger"]);
    assert!(names(&fx.reads).contains(&"app.customers".to_owned()));
}

#[test]
fn sql_function_with_begin_atomic_body() {
    let def = "CREATE OR REPLACE FUNCTION public.archive(days integer)\n RETURNS void\n LANGUAGE sql\nBEGIN ATOMIC\n INSERT INTO archive.events (id, at)  SELECT events.id,\n             events.at\n            FROM events\n           WHERE (events.at < (now() - ((days || ' days'::text))::interval));\n DELETE FROM events\n   WHERE (events.at < (now() - ((days || ' days'::text))::interval));\nEND\n";
    let fx = analyze_body("sql", Some(def));
    assert_eq!(fx.unanalysable, None);
    assert_eq!(names(&fx.writes), ["archive.events", "events"]);
    assert_eq!(names(&fx.reads), ["events"]);
}

#[test]
fn other_languages_and_missing_definitions_are_unanalysable() {
    let fx = analyze_body("plpython3u", Some("CREATE FUNCTION ..."));
    assert_eq!(fx.unanalysable.as_deref(), Some("language plpython3u"));
    let fx = analyze_body("c", None);
    assert_eq!(fx.unanalysable.as_deref(), Some("language c"));
    let fx = analyze_body("plpgsql", None);
    assert_eq!(fx.unanalysable.as_deref(), Some("no definition"));
}

#[test]
fn empty_sql_body_does_nothing() {
    let def = "CREATE OR REPLACE FUNCTION public.noop()\n RETURNS void\n LANGUAGE sql\nAS $function$ $function$\n";
    let fx = analyze_body("sql", Some(def));
    assert_eq!(fx, Default::default());
}

#[test]
fn procedures_options_and_every_expression_form() {
    let def = r#"CREATE OR REPLACE PROCEDURE app.settle(IN p_id integer, INOUT total numeric DEFAULT 0)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'app', 'public'
AS $procedure$
DECLARE
  i integer;
  x integer[];
  rec record;
BEGIN
  CALL app.audit_call(p_id);
  FOR i IN 1..(SELECT count(*) FROM range_src) LOOP
    x[i] := (SELECT v FROM elem_src WHERE id = i);
  END LOOP;
  WHILE (SELECT flag FROM while_src) LOOP
    EXIT;
  END LOOP;
  CASE (SELECT kind FROM case_src)
    WHEN 1 THEN total := 1;
    ELSE total = (SELECT sum(n) FROM eq_src);
  END CASE;
  FOREACH i IN ARRAY (SELECT array_agg(id) FROM array_src) LOOP
    RAISE NOTICE 'value %', (SELECT name FROM raise_src WHERE id = i);
  END LOOP;
  ASSERT (SELECT ok FROM assert_src);
  DELETE FROM app.pending WHERE id = p_id RETURNING id INTO i;
  COMMIT;
EXCEPTION WHEN others THEN
  INSERT INTO app.errors(msg) VALUES (SQLERRM);
END
$procedure$
"#;
    let fx = analyze_body("plpgsql", Some(def));
    assert_eq!(fx.unanalysable, None);
    assert_eq!(names(&fx.writes), ["app.errors", "app.pending"]);
    for src in [
        "range_src",
        "elem_src",
        "while_src",
        "case_src",
        "eq_src",
        "array_src",
        "raise_src",
        "assert_src",
    ] {
        assert!(names(&fx.reads).contains(&src.to_owned()), "{src}");
    }
    assert!(calls(&fx.calls).contains(&"app.audit_call".to_owned()));
}

#[test]
fn sql_procedure() {
    let def = "CREATE OR REPLACE PROCEDURE app.purge()\n LANGUAGE sql\nBEGIN ATOMIC\n DELETE FROM app.sessions\n   WHERE (sessions.expires < now());\nEND\n";
    let fx = analyze_body("sql", Some(def));
    assert_eq!(fx.unanalysable, None);
    assert_eq!(names(&fx.writes), ["app.sessions"]);
}
